//! Security commands: `ricochet token create` (sign a JWT for a role, for
//! development and tests) and `ricochet auth grant|revoke|list|whoami`
//! (manage a broker's grants), with their arguments, and the `--token` /
//! `--token-file` options every command reads its credential from.

use crate::output::{Block, Table, write_json};
use crate::{CliError, Ctx, Result};
use clap::{Args, Subcommand};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The credential options shared by every command.
#[derive(Debug, Clone, Default, Args)]
pub struct CredentialArgs {
    /// Bearer token (JWT) for a broker with authentication on.
    #[arg(long, global = true, env = "RICOCHET_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A file holding the bearer token.
    #[arg(
        long,
        global = true,
        env = "RICOCHET_TOKEN_FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<PathBuf>,
    /// CA certificate(s) (PEM) for an `https://` broker URL.
    #[arg(long, global = true, env = "RICOCHET_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM), for a broker that verifies them.
    #[arg(long, global = true, env = "RICOCHET_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, global = true, env = "RICOCHET_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// TLS material read from the files `--tls-*` name.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// `--tls-ca`.
    pub ca: Option<Vec<u8>>,
    /// `--tls-cert` and `--tls-key`.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl CredentialArgs {
    /// The TLS files' contents.
    pub fn tls(&self) -> Result<TlsFiles> {
        let ca = self
            .tls_ca
            .as_ref()
            .map(|p| read(p, "--tls-ca file"))
            .transpose()?;
        let identity = match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => Some((read(c, "--tls-cert file")?, read(k, "--tls-key file")?)),
            _ => None,
        };
        Ok(TlsFiles { ca, identity })
    }

    /// The token to send, if any.
    pub fn resolve(&self) -> Result<Option<String>> {
        if let Some(t) = &self.token {
            return Ok(Some(t.trim().to_owned()));
        }
        match &self.token_file {
            Some(path) => {
                let t = std::fs::read_to_string(path).map_err(|e| {
                    CliError::Other(format!("cannot read token file {}: {e}", path.display()))
                })?;
                Ok(Some(t.trim().to_owned()))
            }
            None => Ok(None),
        }
    }
}

/// `token …`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Sign a token whose subject is ROLE (HS256 with --secret-file, or
    /// RS256/ES256 with --private-key-file) and print it.
    Create(TokenCreateArgs),
}

/// `token create`.
#[derive(Debug, Args)]
pub struct TokenCreateArgs {
    /// The role the token proves.
    #[arg(long)]
    pub subject: String,
    /// HS256: the file holding the shared secret (the broker's
    /// `auth.token_secret_file`).
    #[arg(
        long,
        conflicts_with = "private_key_file",
        required_unless_present = "private_key_file"
    )]
    pub secret_file: Option<PathBuf>,
    /// RS256 or ES256: a PEM private key (PKCS#8, or PKCS#1 for RSA / SEC1 for EC)
    /// whose public key the broker holds.
    #[arg(long)]
    pub private_key_file: Option<PathBuf>,
    /// Lifetime (`30d`, `12h`); none: the token never expires.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub expires: Option<Duration>,
}

/// `auth …`.
#[derive(Debug, Subcommand)]
pub enum AuthCommand {
    /// Give ROLE permissions on a namespace (`tenant/ns`) or a topic
    /// (`persistent://tenant/ns/topic`).
    Grant(GrantArgs),
    /// Take permissions back (none named: all of them).
    Revoke(GrantArgs),
    /// List grants, optionally of one role or namespace.
    List {
        /// Only this role's.
        #[arg(long)]
        role: Option<String>,
        /// Only this `tenant/namespace`'s.
        #[arg(long)]
        namespace: Option<String>,
    },
    /// Show the role the broker sees for the credentials given.
    Whoami,
}

/// `auth grant|revoke`.
#[derive(Debug, Args)]
pub struct GrantArgs {
    /// The role.
    #[arg(long)]
    pub role: String,
    /// `tenant/namespace` or `persistent://tenant/namespace/topic`.
    #[arg(long)]
    pub resource: String,
    /// `produce`, `consume`, `dead-letters`, `policy`, `admin` (comma-separated or repeated).
    #[arg(long = "permission", short = 'p', value_delimiter = ',')]
    pub permissions: Vec<String>,
}

#[derive(Serialize)]
struct TokenClaims<'a> {
    sub: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    exp: Option<u64>,
    iat: u64,
}

fn read(path: &PathBuf, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| CliError::Other(format!("cannot read {what} {}: {e}", path.display())))
}

/// Signs a token as `args` asks.
pub fn create_token(args: &TokenCreateArgs) -> Result<String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| CliError::Other(e.to_string()))?
        .as_secs();
    let claims = TokenClaims {
        sub: &args.subject,
        exp: args.expires.map(|d| now + d.as_secs()),
        iat: now,
    };
    if args.subject.is_empty() {
        return Err(CliError::Usage("--subject must not be empty".into()));
    }
    let bad_key = |e: jsonwebtoken::errors::Error| CliError::Other(format!("bad key: {e}"));
    let (header, key) = match (&args.secret_file, &args.private_key_file) {
        (Some(f), _) => {
            let mut secret = read(f, "secret file")?;
            while secret.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                secret.pop();
            }
            (
                Header::new(Algorithm::HS256),
                EncodingKey::from_secret(&secret).map_err(bad_key)?,
            )
        }
        (None, Some(f)) => {
            let pem = read(f, "private key file")?;
            match EncodingKey::from_rsa_pem(&pem) {
                Ok(k) => (Header::new(Algorithm::RS256), k),
                Err(_) => (
                    Header::new(Algorithm::ES256),
                    EncodingKey::from_ec_pem(&pem).map_err(|e| {
                        CliError::Other(format!(
                            "{} is not a PEM RSA or EC private key ({e})",
                            f.display()
                        ))
                    })?,
                ),
            }
        }
        (None, None) => {
            return Err(CliError::Usage(
                "give --secret-file or --private-key-file".into(),
            ));
        }
    };
    jsonwebtoken::encode(&header, &claims, &key).map_err(bad_key)
}

/// `token …`.
pub fn token(ctx: &mut Ctx<'_>, cmd: TokenCommand) -> Result<()> {
    match cmd {
        TokenCommand::Create(a) => {
            let t = create_token(&a)?;
            writeln!(ctx.out, "{t}")?;
            Ok(())
        }
    }
}

#[derive(Serialize)]
struct GrantView {
    role: String,
    resource: String,
    permissions: Vec<String>,
}

fn grant_view(g: ricochet_proto::Grant) -> GrantView {
    GrantView {
        role: g.role,
        resource: g.resource,
        permissions: g.permissions,
    }
}

/// `auth …`.
pub async fn auth(ctx: &mut Ctx<'_>, cmd: AuthCommand) -> Result<()> {
    let admin = ctx.admin().await?;
    let write_grants = |ctx: &mut Ctx<'_>, grants: Vec<GrantView>| -> Result<()> {
        if ctx.json() {
            return write_json(ctx.out, &grants);
        }
        let mut t = Table::new(&["ROLE", "RESOURCE", "PERMISSIONS"]);
        for g in grants {
            t.row(vec![g.role, g.resource, g.permissions.join(",")]);
        }
        t.write(ctx.out)
    };
    match cmd {
        AuthCommand::Grant(a) => {
            let g = admin
                .grant(&a.role, &a.resource, &strs(&a.permissions))
                .await?;
            write_grants(ctx, vec![grant_view(g)])
        }
        AuthCommand::Revoke(a) => {
            let g = admin
                .revoke(&a.role, &a.resource, &strs(&a.permissions))
                .await?;
            write_grants(ctx, vec![grant_view(g)])
        }
        AuthCommand::List { role, namespace } => {
            let grants = admin
                .list_grants(role.as_deref(), namespace.as_deref())
                .await?;
            write_grants(ctx, grants.into_iter().map(grant_view).collect())
        }
        AuthCommand::Whoami => {
            let me = admin.who_am_i().await?;
            #[derive(Serialize)]
            struct Me {
                role: String,
                superuser: bool,
                auth_enabled: bool,
            }
            let me = Me {
                role: me.role,
                superuser: me.superuser,
                auth_enabled: me.auth_enabled,
            };
            if ctx.json() {
                return write_json(ctx.out, &me);
            }
            let mut b = Block::new();
            b.kv("role", if me.role.is_empty() { "-" } else { &me.role })
                .kv("superuser", me.superuser)
                .kv("auth enabled", me.auth_enabled);
            b.write(ctx.out, 0)
        }
    }
}

/// The permissions as the admin API takes them.
fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}
