//! `ricochet.example.toml` at the repository root: the broker's own parser
//! accepts it, every value it sets is the default, and it names every
//! setting of every section (commented out where the setting is optional),
//! so a setting added to the config structs without an example line fails
//! here. The settings are enumerated from serde itself: each struct denies
//! unknown fields, and its refusal lists the fields it knows.

use ricochet_broker::BrokerConfig;
use std::collections::BTreeSet;
use std::path::Path;

const EXAMPLE: &str = include_str!("../../../ricochet.example.toml");

/// The sections (TOML tables) of the config, `""` being the top level.
const SECTIONS: [&str; 5] = ["", "auth", "tls", "cluster", "tiered"];

/// The fields the config accepts in `section`, as serde lists them when it
/// refuses an unknown one.
fn known_fields(section: &str) -> BTreeSet<String> {
    let probe = match section {
        "" => "not_a_setting = 1\n".to_owned(),
        s => format!("[{s}]\nnot_a_setting = 1\n"),
    };
    let refusal = toml::from_str::<BrokerConfig>(&probe)
        .expect_err("an unknown field is refused")
        .to_string();
    let list = refusal
        .split_once("expected one of ")
        .or_else(|| refusal.split_once("expected "))
        .unwrap_or_else(|| panic!("no field list in {refusal:?}"))
        .1;
    let fields: BTreeSet<String> = list
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    assert!(
        fields.len() >= 2,
        "[{section}]: {fields:?} from {refusal:?}"
    );
    fields
}

/// The example with its commented-out settings and sections switched on
/// (`# key = value` and `# [section]` lines lose their `# `).
fn uncommented(text: &str) -> String {
    text.lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(rest) if is_setting(rest) => rest,
            _ => l,
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

fn is_setting(line: &str) -> bool {
    let table = line.starts_with('[') && line.trim_end().ends_with(']');
    let key = line.split_once(" = ").is_some_and(|(k, _)| {
        !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
    });
    table || key
}

fn keys(table: &toml::Table, section: &str) -> BTreeSet<String> {
    let t = match section {
        "" => table,
        s => table
            .get(s)
            .and_then(toml::Value::as_table)
            .unwrap_or_else(|| panic!("the example has no [{s}] section, even commented out")),
    };
    t.keys().cloned().collect()
}

#[test]
fn the_example_config_parses_and_shows_the_defaults() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ricochet.example.toml");
    let parsed = BrokerConfig::from_file(&path).expect("the broker accepts the example");
    let shown = toml::to_string(&parsed).unwrap();
    let defaults = toml::to_string(&BrokerConfig::default()).unwrap();
    assert_eq!(
        shown, defaults,
        "every value the example sets is the default"
    );
}

#[test]
fn the_example_config_names_every_setting() {
    let all: toml::Table = toml::from_str(&uncommented(EXAMPLE)).expect("uncommented, it is TOML");
    // With its optional settings switched on it is still a config the
    // parser takes (their values are of the right type).
    toml::from_str::<BrokerConfig>(&uncommented(EXAMPLE))
        .expect("the example's commented-out settings parse");
    for section in SECTIONS {
        let known = known_fields(section);
        let shown = keys(&all, section);
        let missing: Vec<_> = known.difference(&shown).collect();
        let unknown: Vec<_> = shown.difference(&known).collect();
        assert!(
            missing.is_empty() && unknown.is_empty(),
            "ricochet.example.toml [{section}]: settings without an example: {missing:?}; \
             examples of no setting: {unknown:?}"
        );
    }
    // The sections are every table-valued setting of the top level.
    let tables: BTreeSet<&str> = all
        .iter()
        .filter(|(_, v)| v.is_table())
        .map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(
        tables,
        SECTIONS[1..].iter().copied().collect(),
        "a new section needs its place in SECTIONS"
    );
}

/// The check itself: a setting the example leaves out is noticed.
#[test]
fn a_setting_missing_from_the_example_is_noticed() {
    let without: String = EXAMPLE
        .lines()
        .filter(|l| !l.starts_with("# broker_id = ") && !l.starts_with("max_key_size = "))
        .map(|l| format!("{l}\n"))
        .collect();
    let all: toml::Table = toml::from_str(&uncommented(&without)).unwrap();
    assert!(!keys(&all, "").contains("max_key_size"));
    assert!(known_fields("").contains("max_key_size"));
    assert!(!keys(&all, "cluster").contains("broker_id"));
    assert!(known_fields("cluster").contains("broker_id"));
}

/// Every ```` ```toml ```` block of the README and the book is a config the
/// broker takes: it parses as a `BrokerConfig` (which denies unknown
/// settings, so a misspelt or removed one fails here) and validates.
#[test]
fn the_books_toml_blocks_are_broker_configs() {
    let mut checked = 0;
    let mut refused = Vec::new();
    for page in ricochet_testkit::docs::pages() {
        for block in page.code_blocks().iter().filter(|b| b.lang == "toml") {
            checked += 1;
            let parsed = toml::from_str::<BrokerConfig>(&block.text)
                .map_err(|e| e.to_string())
                .and_then(|c| c.validate().map_err(|e| e.to_string()));
            if let Err(e) = parsed {
                refused.push(format!("{}:{}: {e}", page.path.display(), block.line));
            }
        }
    }
    assert!(checked >= 2, "only {checked} TOML blocks in the book");
    assert!(refused.is_empty(), "refused:\n{}", refused.join("\n"));
}
