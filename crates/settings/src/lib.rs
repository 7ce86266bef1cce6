//! Settings files, one way for every crate: the crate's built-in defaults (a TOML text
//! embedded from its own folder), overlaid by the keys of a user's file (top-level keys
//! replace theirs, tables merge key by key), deserialized into the crate's typed settings,
//! with the list of keys the user set (so later defaults, such as a calibration, never
//! override a user's choice). Flags are applied by the caller on the typed value.

use serde::de::DeserializeOwned;
use std::path::Path;

/// Why settings could not be read; always names where they came from.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("{origin}: cannot read: {source}")]
    Io {
        /// The file.
        origin: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The text is not TOML, or a key is unknown or of the wrong type.
    #[error("{origin}: {reason}")]
    Invalid {
        /// The file or source of the text.
        origin: String,
        /// What is wrong (names the key).
        reason: String,
    },
}

impl Error {
    /// Where the settings came from.
    pub fn origin(&self) -> &str {
        match self {
            Error::Io { origin, .. } | Error::Invalid { origin, .. } => origin,
        }
    }

    /// What is wrong, without the origin.
    pub fn reason(&self) -> String {
        match self {
            Error::Io { source, .. } => format!("cannot read: {source}"),
            Error::Invalid { reason, .. } => reason.clone(),
        }
    }
}

/// Settings with the keys the user's text set (`key` or `section.key`).
#[derive(Debug, Clone, PartialEq)]
pub struct Overlaid<T> {
    /// The typed settings.
    pub value: T,
    /// Keys the overlay set.
    pub explicit: Vec<String>,
}

/// Overlays a settings table on `base`: top-level keys replace theirs, tables are merged key
/// by key. Returns the keys `over` set (`key` or `section.key`).
pub fn merge_sections(base: &mut toml::Table, over: toml::Table) -> Vec<String> {
    let mut explicit = Vec::new();
    for (k, v) in over {
        match v {
            toml::Value::Table(t) => {
                explicit.extend(t.keys().map(|s| format!("{k}.{s}")));
                match base.get_mut(&k) {
                    Some(toml::Value::Table(b)) => b.extend(t),
                    _ => {
                        base.insert(k, toml::Value::Table(t));
                    }
                }
            }
            v => {
                explicit.push(k.clone());
                base.insert(k, v);
            }
        }
    }
    explicit
}

fn invalid(origin: &str, e: impl std::fmt::Display) -> Error {
    Error::Invalid {
        origin: origin.to_string(),
        reason: e.to_string(),
    }
}

/// The `defaults` with the keys of `text` (from `origin`) replacing theirs.
pub fn overlay<T: DeserializeOwned>(
    defaults: &str,
    text: &str,
    origin: &str,
) -> Result<Overlaid<T>, Error> {
    let mut base: toml::Table = toml::from_str(defaults).map_err(|e| invalid("built-in", e))?;
    let over: toml::Table = toml::from_str(text).map_err(|e| invalid(origin, e))?;
    let explicit = merge_sections(&mut base, over);
    let value: T = toml::Value::Table(base)
        .try_into()
        .map_err(|e: toml::de::Error| invalid(origin, e))?;
    Ok(Overlaid { value, explicit })
}

/// [`overlay`] of the file at `path` (named by its path in errors).
pub fn load<T: DeserializeOwned>(defaults: &str, path: &Path) -> Result<Overlaid<T>, Error> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        origin: origin.clone(),
        source,
    })?;
    overlay(defaults, &text, &origin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct S {
        a: u32,
        b: String,
        t: T,
    }

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct T {
        x: u32,
        y: u32,
    }

    const DEFAULTS: &str = "a = 1\nb = \"x\"\n[t]\nx = 1\ny = 2\n";

    #[test]
    fn overlay_replaces_only_given_keys_and_lists_them() {
        let o: Overlaid<S> = overlay(DEFAULTS, "a = 5\n[t]\ny = 7\n", "u.toml").unwrap();
        assert_eq!(o.value.a, 5);
        assert_eq!(o.value.b, "x");
        assert_eq!(o.value.t, T { x: 1, y: 7 });
        assert_eq!(o.explicit, ["a", "t.y"]);
        let o: Overlaid<S> = overlay(DEFAULTS, "", "u.toml").unwrap();
        assert!(o.explicit.is_empty());
    }

    #[test]
    fn errors_name_the_origin_and_the_key() {
        let e = overlay::<S>(DEFAULTS, "c = 1", "u.toml").unwrap_err();
        assert_eq!(e.origin(), "u.toml");
        assert!(e.to_string().contains('c'), "{e}");
        let e = overlay::<S>(DEFAULTS, "a = \"many\"", "v.toml").unwrap_err();
        assert!(e.to_string().starts_with("v.toml: "), "{e}");
        let e = overlay::<S>(DEFAULTS, "a = ", "w.toml").unwrap_err();
        assert_eq!(e.origin(), "w.toml");
        let e = load::<S>(DEFAULTS, Path::new("/nonexistent/s.toml")).unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/s.toml"), "{e}");
    }
}
