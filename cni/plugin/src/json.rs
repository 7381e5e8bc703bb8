//! JSON as the reference plugins print it: results and errors alike.

use serde::Serialize;

/// Serialises with the reference plugins' 4-space indentation, no trailing newline.
pub fn to_pretty_json<T: Serialize>(value: &T) -> String {
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    // Serialising plain structs and maps of strings into memory cannot fail.
    if value.serialize(&mut ser).is_err() {
        return String::from("{}");
    }
    String::from_utf8(out).unwrap_or_default()
}
