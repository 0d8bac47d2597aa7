//! The near-miss corpus format (`tests/data/lockdown-corpus.tsv`).

use std::collections::HashMap;

use super::backtick;

/// Parse the near-miss corpus: one case per line, `name<TAB>expected`.
///
/// - `expected` is `write` (a write surface) or `allowed`; the result pairs
///   each name with `true` for `write`.
/// - A name starting with `"` is a JSON string, which is how padding, control
///   characters, non-ASCII look-alikes, the empty name and a leading `#` are
///   written (`"  MEMORY_BLOCK_APPEND "`, `""`). Any other name is taken
///   verbatim and may not be empty or have surrounding whitespace, so that no
///   case depends on invisible characters.
/// - Blank lines and lines whose first non-blank character is `#` are
///   ignored. A name may appear only once.
///
/// # Errors
///
/// Every malformed line, each with its line number, in one message.
pub fn parse_corpus(text: &str) -> Result<Vec<(String, bool)>, String> {
    let mut cases = Vec::new();
    let mut first_seen: HashMap<String, usize> = HashMap::new();
    let mut errors = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line_no = index + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        match parse_corpus_line(line) {
            Ok((name, expected)) => {
                if let Some(first) = first_seen.get(&name) {
                    errors.push(format!(
                        "line {line_no}: duplicate name {} (first on line {first})",
                        backtick(&name)
                    ));
                } else {
                    first_seen.insert(name.clone(), line_no);
                    cases.push((name, expected));
                }
            }
            Err(message) => errors.push(format!("line {line_no}: {message}")),
        }
    }
    if errors.is_empty() {
        Ok(cases)
    } else {
        Err(errors.join("; "))
    }
}

/// One non-comment corpus line.
fn parse_corpus_line(line: &str) -> Result<(String, bool), String> {
    let mut fields = line.split('\t');
    let (Some(name_field), Some(expected_field), None) =
        (fields.next(), fields.next(), fields.next())
    else {
        return Err("expected exactly two tab-separated fields: name and expectation".to_owned());
    };
    let name = if name_field.starts_with('"') {
        serde_json::from_str::<String>(name_field).map_err(|e| {
            format!(
                "name {} is not a valid JSON string: {e}",
                backtick(name_field)
            )
        })?
    } else if name_field.is_empty() {
        return Err("empty name field: write the empty name as `\"\"`".to_owned());
    } else if name_field.trim() != name_field {
        return Err(format!(
            "name {} has surrounding whitespace: write padded names as JSON strings",
            backtick(name_field)
        ));
    } else {
        name_field.to_owned()
    };
    let expected = match expected_field.trim() {
        "write" => true,
        "allowed" => false,
        other => {
            return Err(format!(
                "expectation must be `write` or `allowed`, found {}",
                backtick(other)
            ));
        }
    };
    Ok((name, expected))
}
