//! The bundled example policy: the report-production hierarchy of the lab
//! document, used by `serve` without `--policy` and by `demo`.

/// The bundle's text.
pub const EXAMPLE_POLICY: &str = include_str!("../../../examples/report-hierarchy/policy.yaml");
