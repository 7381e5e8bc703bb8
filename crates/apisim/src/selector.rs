//! Label and field selectors: the `labelSelector`/`fieldSelector` query strings of list and
//! watch, and the `metav1.LabelSelector` objects of webhook configurations and owners.
//!
//! Promises the same grammar as apimachinery's `labels.Parse` / `fields.ParseSelector` for the
//! operators Kubernetes documents (`=`, `==`, `!=`, `in`, `notin`, exists, `!`), and rejects what
//! it cannot evaluate with a message naming the offending term instead of matching everything.

use std::collections::BTreeMap;

use serde_json::Value;

/// A selector that cannot be parsed; the message is returned to the client as a 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl LabelRequirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Self::Equals(k, v) => labels.get(k) == Some(v),
            // As in apimachinery: `!=` also matches objects without the label.
            Self::NotEquals(k, v) => labels.get(k) != Some(v),
            Self::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Self::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Self::Exists(k) => labels.contains_key(k),
            Self::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for term in split_top_level(text) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            requirements.push(parse_label_term(term)?);
        }
        Ok(Self { requirements })
    }

    /// Reads a `metav1.LabelSelector` (`matchLabels`, `matchExpressions`). A missing selector
    /// (`null`) matches everything, as in webhook configurations.
    pub fn from_json(selector: &Value) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if selector.is_null() {
            return Ok(Self { requirements });
        }
        let object = selector
            .as_object()
            .ok_or_else(|| SelectorError("a label selector must be an object".into()))?;
        if let Some(labels) = object.get("matchLabels").filter(|v| !v.is_null()) {
            let labels = labels
                .as_object()
                .ok_or_else(|| SelectorError("matchLabels must be an object".into()))?;
            for (key, value) in labels {
                let value = value
                    .as_str()
                    .ok_or_else(|| SelectorError(format!("matchLabels[{key}] must be a string")))?;
                validate_key(key)?;
                requirements.push(LabelRequirement::Equals(key.clone(), value.to_owned()));
            }
        }
        if let Some(expressions) = object.get("matchExpressions").filter(|v| !v.is_null()) {
            let expressions = expressions
                .as_array()
                .ok_or_else(|| SelectorError("matchExpressions must be a list".into()))?;
            for expression in expressions {
                requirements.push(parse_expression(expression)?);
            }
        }
        Ok(Self { requirements })
    }

    /// Whether an object with these labels is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether the selector has no requirement (selects everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

fn parse_expression(expression: &Value) -> Result<LabelRequirement, SelectorError> {
    let key = expression
        .get("key")
        .and_then(Value::as_str)
        .ok_or_else(|| SelectorError("matchExpressions[].key must be a string".into()))?
        .to_owned();
    validate_key(&key)?;
    let operator = expression
        .get("operator")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let values: Vec<String> = expression
        .get("values")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    match operator {
        "In" | "NotIn" if values.is_empty() => Err(SelectorError(format!(
            "matchExpressions for {key:?}: values must be non-empty for {operator}"
        ))),
        "In" => Ok(LabelRequirement::In(key, values)),
        "NotIn" => Ok(LabelRequirement::NotIn(key, values)),
        "Exists" | "DoesNotExist" if !values.is_empty() => Err(SelectorError(format!(
            "matchExpressions for {key:?}: values must be empty for {operator}"
        ))),
        "Exists" => Ok(LabelRequirement::Exists(key)),
        "DoesNotExist" => Ok(LabelRequirement::DoesNotExist(key)),
        other => Err(SelectorError(format!(
            "matchExpressions for {key:?}: {other:?} is not a valid label selector operator \
             (In, NotIn, Exists, DoesNotExist)"
        ))),
    }
}

/// Splits on commas that are not inside a `( … )` value list.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn parse_label_term(term: &str) -> Result<LabelRequirement, SelectorError> {
    if let Some(key) = term.strip_prefix('!') {
        let key = key.trim();
        validate_key(key)?;
        return Ok(LabelRequirement::DoesNotExist(key.to_owned()));
    }
    if let Some((key, value)) = term.split_once("!=") {
        return equality(key, value, false);
    }
    if let Some((key, value)) = term.split_once("==") {
        return equality(key, value, true);
    }
    if let Some((key, value)) = term.split_once('=') {
        return equality(key, value, true);
    }
    let words: Vec<&str> = term.splitn(2, char::is_whitespace).collect();
    if let [key, rest] = words.as_slice() {
        let rest = rest.trim();
        let (set_in, list) = if let Some(list) = rest.strip_prefix("notin") {
            (false, list)
        } else if let Some(list) = rest.strip_prefix("in") {
            (true, list)
        } else {
            return Err(SelectorError(format!(
                "unable to parse requirement {term:?}: expected one of =, ==, !=, in, notin"
            )));
        };
        let list = list.trim();
        let inner = list
            .strip_prefix('(')
            .and_then(|l| l.strip_suffix(')'))
            .ok_or_else(|| {
                SelectorError(format!(
                    "unable to parse requirement {term:?}: values must be in parentheses"
                ))
            })?;
        let values: Vec<String> = inner
            .split(',')
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .collect();
        if values.is_empty() {
            return Err(SelectorError(format!(
                "unable to parse requirement {term:?}: for 'in', 'notin' operators, values set can't be empty"
            )));
        }
        for value in &values {
            validate_value(value)?;
        }
        validate_key(key)?;
        let key = (*key).to_owned();
        return Ok(if set_in {
            LabelRequirement::In(key, values)
        } else {
            LabelRequirement::NotIn(key, values)
        });
    }
    validate_key(term)?;
    Ok(LabelRequirement::Exists(term.to_owned()))
}

fn equality(key: &str, value: &str, equal: bool) -> Result<LabelRequirement, SelectorError> {
    let (key, value) = (key.trim(), value.trim());
    validate_key(key)?;
    validate_value(value)?;
    Ok(if equal {
        LabelRequirement::Equals(key.to_owned(), value.to_owned())
    } else {
        LabelRequirement::NotEquals(key.to_owned(), value.to_owned())
    })
}

/// A qualified name with an optional DNS prefix: `[prefix/]name`, name ≤ 63 characters of
/// alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
fn validate_key(key: &str) -> Result<(), SelectorError> {
    let name = match key.rsplit_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() || prefix.len() > 253 {
                return Err(SelectorError(format!(
                    "invalid label key {key:?}: bad prefix"
                )));
            }
            name
        }
        None => key,
    };
    if name.is_empty() || name.len() > 63 || !is_label_token(name) {
        return Err(SelectorError(format!(
            "invalid label key {key:?}: name part must consist of alphanumeric characters, \
             '-', '_' or '.', and must start and end with an alphanumeric character"
        )));
    }
    Ok(())
}

fn validate_value(value: &str) -> Result<(), SelectorError> {
    if value.is_empty() || (value.len() <= 63 && is_label_token(value)) {
        Ok(())
    } else {
        Err(SelectorError(format!(
            "invalid label value {value:?}: must be 63 characters or less, alphanumeric, '-', \
             '_' or '.', starting and ending with an alphanumeric character"
        )))
    }
}

fn is_label_token(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
}

/// A parsed field selector: `field=value`, `field==value`, `field!=value`, comma-separated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter, accepting only `supported` field paths (the
    /// real server rejects others with "field label not supported").
    pub fn parse(text: &str, supported: &[&str]) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(SelectorError(format!(
                    "invalid selector: {term:?}; can't understand {term:?}"
                )));
            };
            let field = field.trim();
            if !supported.contains(&field) {
                return Err(SelectorError(format!("field label not supported: {field}")));
            }
            terms.push((field.to_owned(), equal, value.trim().to_owned()));
        }
        Ok(Self { terms })
    }

    /// Whether `object` is selected; a field missing from the object compares as `""`.
    pub fn matches(&self, object: &Value) -> bool {
        self.terms.iter().all(|(field, equal, value)| {
            let actual = field_value(object, field);
            (actual == *value) == *equal
        })
    }

    /// The value required by an equality term on `field`, if any (used for watch fast paths
    /// and for `kubectl wait`'s single-object watches).
    pub fn required_value(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|(f, equal, _)| f == field && *equal)
            .map(|(_, _, v)| v.as_str())
    }
}

/// Reads a dotted field path as the string the server compares (booleans and numbers as text).
pub fn field_value(object: &Value, path: &str) -> String {
    let mut current = object;
    for part in path.split('.') {
        match current.get(part) {
            Some(next) => current = next,
            None => return String::new(),
        }
    }
    match current {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The labels of an object, as a map (non-string values are ignored).
pub fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn label_selector_strings_match_like_apimachinery() {
        let l = labels(&[
            ("app", "db"),
            ("tier", "backend"),
            ("ipkeep.dev/pinned", ""),
        ]);
        let cases = [
            ("", true),
            ("app=db", true),
            ("app==db", true),
            ("app=web", false),
            ("app!=web", true),
            ("missing!=x", true),
            ("app in (db, web)", true),
            ("app in (web)", false),
            ("app notin (web)", true),
            ("missing notin (web)", true),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=db,tier=backend", true),
            ("app=db,tier in (frontend,cache)", false),
            ("ipkeep.dev/pinned", true),
            ("ipkeep.dev/pinned=", true),
        ];
        for (text, expected) in cases {
            let selector = LabelSelector::parse(text).unwrap();
            assert_eq!(selector.matches(&l), expected, "selector {text:?}");
        }
    }

    #[test]
    fn malformed_label_selectors_are_rejected_with_the_term() {
        for text in ["app in db", "app in ()", "-bad=x", "app=bad value", "a b c"] {
            let err = LabelSelector::parse(text).unwrap_err();
            assert!(!err.0.is_empty(), "{text:?}");
        }
    }

    #[test]
    fn label_selector_objects_match() {
        let l = labels(&[("app", "db"), ("zone", "a")]);
        let cases = [
            (json!(null), true),
            (json!({}), true),
            (json!({"matchLabels": {"app": "db"}}), true),
            (json!({"matchLabels": {"app": "web"}}), false),
            (
                json!({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}),
                false,
            ),
        ];
        for (selector, expected) in cases {
            let parsed = LabelSelector::from_json(&selector).unwrap();
            assert_eq!(parsed.matches(&l), expected, "{selector}");
        }
        assert!(
            LabelSelector::from_json(
                &json!({"matchExpressions": [{"key": "a", "operator": "Near"}]})
            )
            .is_err()
        );
    }

    #[test]
    fn field_selectors_compare_dotted_paths() {
        let pod = json!({"metadata": {"name": "p1", "namespace": "db"},
                         "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let supported = [
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "status.phase",
        ];
        let cases = [
            ("metadata.name=p1", true),
            ("metadata.name==p2", false),
            ("spec.nodeName=n1,status.phase!=Pending", true),
            ("spec.nodeName=", false),
            ("status.phase!=Running", false),
        ];
        for (text, expected) in cases {
            let selector = FieldSelector::parse(text, &supported).unwrap();
            assert_eq!(selector.matches(&pod), expected, "{text}");
        }
        let unscheduled = json!({"metadata": {"name": "p"}, "spec": {}});
        assert!(
            FieldSelector::parse("spec.nodeName=", &supported)
                .unwrap()
                .matches(&unscheduled)
        );
        let err = FieldSelector::parse("spec.hostname=x", &supported).unwrap_err();
        assert_eq!(err.0, "field label not supported: spec.hostname");
    }
}
