//! Sign-in by token. With `[auth]` on, the console calls the broker as
//! whoever signed in: the sign-in page takes a JWT (what `ricochet token
//! create` writes), asks the broker who it proves (`Auth/WhoAmI`, through
//! the same authentication as every call), and keeps it in a cookie that is
//! `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's page
//! or form makes the browser send it) and `Secure` when the console is
//! reached over TLS (or through a TLS proxy that says so with
//! `X-Forwarded-Proto: https`). Sign-out clears it. The token itself is the session:
//! the console stores nothing about it, and the broker checks it, expiry
//! included, on every call. Without `[auth]` no sign-in is needed (the
//! sign-in page says so and sets nothing).

use super::{ConsoleError, ConsoleState, Page, layout};
use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine;
use maud::html;

/// The cookie that holds the token.
pub const COOKIE: &str = "ricochet_console_token";
/// Longest token accepted (a JWT with a large key id is well under this).
const MAX_TOKEN: usize = 8 * 1024;

/// Whether `token` could be a JWT: three base64url parts. Anything else
/// (a `;` or a space that would change the cookie, a control character) is
/// refused before it reaches a cookie or a header.
fn well_formed(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= MAX_TOKEN
        && token.split('.').count() == 3
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'='))
}

/// The token of the request's sign-in cookie, if it holds a well-formed one.
pub fn token_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim())
        .filter(|t| well_formed(t))
        .map(str::to_owned)
}

/// The role (`sub`) a token names, read without checking it: for the page
/// frame's "signed in as" only. Every call is checked by the broker.
pub fn role_shown(token: &str) -> Option<String> {
    let claims = token.split('.').nth(1)?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(claims.trim_end_matches('='))
        .ok()?;
    let value: serde_json::Value = serde_json::from_slice(&json).ok()?;
    value.get("sub")?.as_str().map(str::to_owned)
}

/// Whether the cookie must be `Secure`: the console is served over TLS
/// ([`Options::secure_cookie`](crate::Options::secure_cookie)), or the
/// request reached a TLS proxy in front of it (`X-Forwarded-Proto: https`).
fn secure(st: &ConsoleState, headers: &HeaderMap) -> bool {
    st.options.secure_cookie
        || headers
            .get("x-forwarded-proto")
            .is_some_and(|p| p.as_bytes().eq_ignore_ascii_case(b"https"))
}

/// The `Set-Cookie` value holding `token` (or, `None`, clearing it).
fn cookie(token: Option<&str>, secure: bool) -> Result<HeaderValue, ConsoleError> {
    let secure = if secure { "; Secure" } else { "" };
    let value = match token {
        Some(t) => format!("{COOKIE}={t}; Path=/; HttpOnly; SameSite=Strict{secure}"),
        None => format!("{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict{secure}"),
    };
    HeaderValue::from_str(&value).map_err(|_| ConsoleError::bad_request("a token is one line"))
}

fn form(message: Option<&str>) -> maud::Markup {
    html! {
        @if let Some(m) = message { p.error #error { (m) } }
        form #sign-in-form method="post" action="/sign-in" {
            label {
                "Token (a JWT, as " code { "ricochet token create" } " writes it)" br;
                textarea #token name="token" rows="4" cols="80" autocomplete="off" {}
            }
            br;
            button.go #sign-in-submit type="submit" { "Sign in" }
        }
        p {
            "The token is kept in an HttpOnly cookie of this browser until you sign out or close it, "
            "and sent to the broker with every page and action, which it authorizes and audits as for "
            "a gRPC call of its role."
        }
    }
}

/// `GET /sign-in`: the form.
pub(crate) async fn sign_in_page(_st: ConsoleState) -> Page {
    Ok(layout(
        "Sign in",
        html! {
            h1 { "Sign in" }
            (form(None))
        },
    ))
}

/// `POST /sign-in` with `token`: checked with the broker, then kept in the
/// cookie and the browser sent to the topics. A token the broker refuses is
/// answered 401 with its reason, and nothing is kept.
pub(crate) async fn sign_in(st: ConsoleState, headers: HeaderMap, body: Bytes) -> Response {
    let token = serde_urlencoded::from_bytes::<Vec<(String, String)>>(&body)
        .ok()
        .and_then(|pairs| pairs.into_iter().find(|(k, _)| k == "token"))
        .map(|(_, t)| t.split_whitespace().collect::<String>())
        .unwrap_or_default();
    let refuse = |status: StatusCode, why: &str| {
        (
            status,
            layout(
                "Sign in",
                html! {
                    h1 { "Sign in" }
                    (form(Some(why)))
                },
            ),
        )
            .into_response()
    };
    if !well_formed(&token) {
        return refuse(
            StatusCode::BAD_REQUEST,
            "that is not a token: a JWT is three base64url parts separated by dots",
        );
    }
    let who = match st.api.signed(Some(token.clone())).who_am_i().await {
        Ok(who) => who,
        Err(s) => {
            let status = ConsoleError::from(s.clone()).status;
            return refuse(
                status,
                &format!("the broker refused the token: {}", s.message()),
            );
        }
    };
    if !who.auth_enabled {
        return (
            StatusCode::OK,
            layout(
                "No sign-in needed",
                html! {
                    h1 { "No sign-in needed" }
                    p #no-auth { "This broker runs without [auth]: every page and action is open to whoever reaches the console, and nothing was kept." }
                    p { a href="/" { "To the topics" } }
                },
            ),
        )
            .into_response();
    }
    match cookie(Some(&token), secure(&st, &headers)) {
        Ok(c) => {
            tracing::info!(role = %who.role, "signed in to the web console");
            ([(header::SET_COOKIE, c)], Redirect::to("/")).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// `POST /sign-out`: clears the cookie.
pub(crate) async fn sign_out(st: ConsoleState, headers: HeaderMap) -> Response {
    match cookie(None, secure(&st, &headers)) {
        Ok(c) => (
            [(header::SET_COOKIE, c)],
            layout(
                "Signed out",
                html! {
                    h1 #signed-out { "Signed out" }
                    p { "This browser no longer holds the token. " a href="/sign-in" { "Sign in again" } }
                },
            ),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JWT: &str = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJvcHMifQ.c2lnbmF0dXJl";

    #[test]
    fn the_cookie_is_read_among_others_and_only_when_well_formed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("a=b; {COOKIE}={JWT}; c=d")).unwrap(),
        );
        assert_eq!(token_of(&h).as_deref(), Some(JWT));
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("{COOKIE}=not a token")).unwrap(),
        );
        assert_eq!(token_of(&h), None);
        assert_eq!(token_of(&HeaderMap::new()), None);
    }

    #[test]
    fn a_token_that_would_change_the_cookie_is_not_well_formed() {
        assert!(well_formed(JWT));
        for bad in [
            "",
            "a.b",
            "a.b.c;Domain=x",
            "a.b.c d",
            "a.b.c\r\n",
            "a.b.c,d",
        ] {
            assert!(!well_formed(bad), "{bad:?}");
        }
        assert!(!well_formed(&format!("a.b.{}", "c".repeat(MAX_TOKEN))));
    }

    #[test]
    fn the_role_shown_is_the_subject_and_the_cookie_is_strict() {
        assert_eq!(role_shown(JWT).as_deref(), Some("ops"));
        assert_eq!(role_shown("a.b.c"), None);
        let set = cookie(Some(JWT), true).unwrap();
        let set = set.to_str().unwrap();
        for attr in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/"] {
            assert!(set.contains(attr), "{set}");
        }
        let plain = cookie(Some(JWT), false).unwrap();
        assert!(!plain.to_str().unwrap().contains("Secure"));
        let gone = cookie(None, false).unwrap();
        assert!(gone.to_str().unwrap().contains("Max-Age=0"));
    }
}
