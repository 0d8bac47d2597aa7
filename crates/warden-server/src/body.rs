//! Reading request bodies: size limit, strict JSON, typed wire structs.
//!
//! A body goes through three gates, each with its own status:
//!
//! 1. **Size** (413 `body_too_large`): a `Content-Length` over the limit is
//!    refused before reading; a chunked body is cut off at the limit.
//! 2. **JSON** (400): the bytes must be one UTF-8 JSON value and nothing
//!    else (`malformed_json`), with no key repeated in any object
//!    (`duplicate_key`: two parsers disagreeing on which `action` a step has
//!    is exactly the gap an attacker looks for) and no deeper than the depth
//!    limit (`json_too_deep`, checked while parsing, before a deep value is
//!    built). The reader is core's [`warden_core::json`], the one the SOP
//!    parser uses.
//! 3. **Shape** (422): the value must deserialize into the route's wire
//!    struct, whose unknown fields are refused (`unknown_field`,
//!    `missing_field`, `wrong_type`, `invalid_value`, with the field's path
//!    in `details.field`).

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use warden_core::json::{self, JsonErrorKind};
use warden_store::Store;

use crate::error::ApiError;
use crate::state::AppState;

/// Deepest nesting the server ever accepts, whatever is configured: the
/// core reader's cap, below `serde_json`'s own recursion limit.
pub const MAX_SUPPORTED_DEPTH: usize = json::MAX_SUPPORTED_DEPTH;

/// Parse `bytes` as exactly one JSON value, refusing duplicate keys and
/// nesting deeper than `max_depth` (the root container counts as 1).
pub fn parse_strict(bytes: &[u8], max_depth: usize) -> Result<Value, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "malformed_json",
            "the body is empty; this route needs a JSON object",
        ));
    }
    json::parse_slice(bytes, max_depth).map_err(|e| match e.kind() {
        JsonErrorKind::TooDeep { max } => ApiError::bad_request(
            "json_too_deep",
            format!("the body nests deeper than {max} levels"),
        )
        .with_details(json!({"max_depth": max, "path": cut(e.path(), 128)})),
        JsonErrorKind::DuplicateKey { key } => {
            ApiError::bad_request("duplicate_key", "an object in the body repeats a key")
                .with_details(json!({"key": cut(key, 64), "path": cut(e.path(), 128)}))
        }
        JsonErrorKind::Malformed {
            line,
            column,
            message,
        } => ApiError::bad_request(
            "malformed_json",
            format!("the body is not valid JSON: {message}"),
        )
        .with_details(json!({"line": line, "column": column})),
    })
}

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", s.get(..end).unwrap_or(""))
}

/// Deserialize a parsed value into a wire struct, with the failing field's
/// path in the error.
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().to_string();
        let code = if message.starts_with("unknown field") {
            "unknown_field"
        } else if message.starts_with("missing field") {
            "missing_field"
        } else if message.starts_with("invalid type") {
            "wrong_type"
        } else {
            "invalid_value"
        };
        let field = if path == "." { String::new() } else { path };
        let shown = if field.is_empty() {
            "body".to_owned()
        } else {
            format!("field `{}`", cut(&field, 128))
        };
        ApiError::invalid(code, format!("{shown}: {message}"))
            .with_details(json!({"field": cut(&field, 128)}))
    })
}

/// Whether the body is declared JSON: `application/json` or
/// `application/*+json`. A body without a `content-type` is refused too (the
/// README's 415), so nothing is ever read as JSON by guessing.
fn content_type_ok(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    let Ok(ct) = ct.to_str() else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Read at most `limit` bytes of `body`.
pub async fn read_limited(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the body is larger than {limit} bytes"),
        )
        .with_details(json!({"max_bytes": limit}))
    };
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > limit as u64
    {
        return Err(too_large());
    }
    match axum::body::to_bytes(body, limit).await {
        Ok(b) => Ok(b),
        Err(e) => {
            let inner = e.into_inner();
            if inner
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                Err(too_large())
            } else {
                Err(ApiError::bad_request(
                    "body_unreadable",
                    "the body could not be read",
                ))
            }
        }
    }
}

/// A JSON body deserialized into the wire struct `T`, read through all three
/// gates of this module.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<T, S> FromRequest<AppState<S>> for JsonBody<T>
where
    T: DeserializeOwned,
    S: Store,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState<S>) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        if !content_type_ok(&parts.headers) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "the body must be `application/json`",
            ));
        }
        let limits = &state.config().limits;
        let bytes = read_limited(&parts.headers, body, limits.max_body_bytes).await?;
        let value = parse_strict(&bytes, state.max_json_depth())?;
        // Every request body is an object: serde would otherwise fill a
        // struct from an array, positionally.
        if !value.is_object() {
            return Err(
                ApiError::invalid("wrong_type", "the body must be a JSON object")
                    .with_details(json!({"field": ""})),
            );
        }
        from_value(value).map(JsonBody)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(r: Result<Value, ApiError>) -> String {
        r.err().map(|e| e.code.to_string()).unwrap_or_default()
    }

    #[test]
    fn strict_parse_accepts_plain_json() {
        let v = parse_strict(br#"{"a": [1, {"b": null}], "c": "x"}"#, 8).unwrap();
        assert_eq!(v, json!({"a": [1, {"b": null}], "c": "x"}));
    }

    #[test]
    fn strict_parse_refuses_duplicates_depth_trailing_and_bad_utf8() {
        assert_eq!(code(parse_strict(br#"{"a":1,"a":2}"#, 8)), "duplicate_key");
        assert_eq!(
            code(parse_strict(br#"{"x":{"a":1,"a":2}}"#, 8)),
            "duplicate_key"
        );
        assert_eq!(code(parse_strict(b"[[[[1]]]]", 3)), "json_too_deep");
        assert!(parse_strict(b"[[[1]]]", 3).is_ok());
        assert_eq!(code(parse_strict(b"{} {}", 8)), "malformed_json");
        assert_eq!(code(parse_strict(b"\"\xff\"", 8)), "malformed_json");
        assert_eq!(code(parse_strict(b"", 8)), "malformed_json");
        let deep = "[".repeat(100_000);
        assert_eq!(code(parse_strict(deep.as_bytes(), 500)), "json_too_deep");
    }
}
