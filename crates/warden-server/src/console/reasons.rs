//! Plain language for reason codes: the one table. A code with a parameter
//! (`restricted_by:no_export`) is explained by its kind and names the
//! parameter; a code missing here is shown as the code.

/// What each reason code means, in words.
const TABLE: &[(&str, &str)] = &[
    (
        "action_not_in_effective_capabilities",
        "the agent is not allowed this action: it is not among its effective capabilities",
    ),
    (
        "actor_is_not_owner",
        "only the record's owner may change it",
    ),
    ("agent_registered", "the agent was registered"),
    (
        "agent_revoked",
        "the agent was revoked, so it may do nothing",
    ),
    ("agent_token_required", "this needs an agent's own token"),
    (
        "aggregation_backstop",
        "together, the data gathered so far is too sensitive for this to go ahead without review",
    ),
    (
        "argument_confusable",
        "an argument looks like a trusted value but uses look-alike characters",
    ),
    ("argument_missing", "a required argument is missing"),
    (
        "argument_not_vouched",
        "an argument's value did not come from the user or a trusted source",
    ),
    (
        "argument_schema_violation",
        "an argument does not match the action's schema",
    ),
    ("argument_too_large", "an argument is too large to check"),
    (
        "argument_too_many_values",
        "an argument holds more values than its rule allows",
    ),
    ("argument_wrong_type", "an argument has the wrong type"),
    (
        "arguments_vouched",
        "every guarded argument came from a trusted source",
    ),
    (
        "binding_not_satisfied",
        "a planned value does not occur in the result it was bound to",
    ),
    (
        "bundle_seed",
        "set up from the policy bundle when the store was created",
    ),
    ("call_allowed", "the call was allowed"),
    ("call_failed", "the tool reported an error"),
    (
        "call_replayed",
        "the same call was answered again from its record",
    ),
    ("call_result_recorded", "the tool's result was recorded"),
    ("capability_granted", "the capability is granted"),
    (
        "capability_not_inherited",
        "the parent does not have this capability, so the child cannot either",
    ),
    (
        "classification_above_ceiling",
        "the data is more sensitive than this destination allows",
    ),
    (
        "combined_from",
        "a policy value combined from several levels of the hierarchy",
    ),
    (
        "context_accumulated",
        "the result's labels were added to the context",
    ),
    ("context_allowed", "the context allows it"),
    (
        "context_constrained",
        "allowed, with obligations from the context",
    ),
    ("context_created", "a context envelope was created"),
    (
        "context_delegated",
        "the context was passed on to a delegated agent",
    ),
    (
        "cross_owner_memory_write",
        "an agent may write only its own memory",
    ),
    (
        "declassification_invalid",
        "the declassification is not valid",
    ),
    (
        "declassification_not_authorized",
        "this agent may not declassify",
    ),
    ("declassified", "the context was declassified"),
    ("delegation_denied", "the delegation is refused"),
    ("depth_exceeded", "the hierarchy would be too deep"),
    (
        "escalation_approved",
        "a reviewer approved it; it proceeds once",
    ),
    ("escalation_consumed", "the approval was used"),
    (
        "escalation_not_pending",
        "it was already approved or rejected",
    ),
    ("escalation_rejected", "a reviewer rejected it"),
    (
        "escalation_reviewer_not_authorized",
        "this reviewer may not decide it",
    ),
    (
        "escalation_unbound",
        "it binds no request (stored by an earlier version): reject it",
    ),
    (
        "escalation_withdrawn",
        "another request for the same thing used its approval",
    ),
    ("host_not_allowed", "the host is not on the allowed list"),
    (
        "not_an_ancestor",
        "only the operator or an ancestor may do this",
    ),
    ("not_run_agent", "only the run's agent may do this"),
    (
        "not_session_agent",
        "only the session's agent (or an ancestor) may do this",
    ),
    (
        "not_visible_from",
        "the record exists but is not visible to this agent",
    ),
    ("operator_only", "this needs the operator"),
    ("owner_delete", "the owner deleted its record"),
    ("owner_write", "the owner wrote its record"),
    ("parent_revoked", "the parent was revoked"),
    ("plan_rejected", "the plan was refused"),
    ("quota_requests_per_second", "too many requests per second"),
    (
        "record_not_found",
        "no such record along the agent's lineage",
    ),
    ("restricted_by", "a restriction on the context forbids it"),
    ("revision_conflict", "the record changed since it was read"),
    ("revoked", "revoked, with its whole subtree"),
    ("run_admitted", "the run was admitted"),
    ("run_rejected", "the run was refused"),
    ("secret_granted", "the secret is granted to this agent"),
    (
        "secret_not_granted",
        "the secret is not granted to this agent",
    ),
    (
        "sensitivity_floor",
        "the data is too sensitive for this to go ahead without review",
    ),
    ("session_call_limit", "the session holds its most calls"),
    ("session_cancelled", "the session was cancelled"),
    ("session_opened", "the session was opened"),
    ("step_allowed", "the step was allowed"),
    (
        "step_in_progress",
        "another worker holds the step; it was not run again",
    ),
    (
        "step_lease_held",
        "only the worker holding the step may report it",
    ),
    ("step_out_of_order", "the step came out of order"),
    ("token_issued", "a token was issued"),
    ("token_revoked", "the token was revoked"),
    ("unknown_action", "the action is not in the catalogue"),
    ("unknown_agent", "no such agent"),
    (
        "unplanned_call",
        "the call matches no step of the session's plan",
    ),
    (
        "visible_from",
        "the value comes from this owner, who lets the agent see it",
    ),
];

/// The plain-language text of `code` (`kind:param` names the parameter);
/// the code itself when the table has no entry.
pub(crate) fn explain(code: &str) -> String {
    let (kind, param) = match code.split_once(':') {
        Some((k, p)) => (k, Some(p)),
        None => (code, None),
    };
    match TABLE.iter().find(|(k, _)| *k == kind) {
        Some((_, text)) => match param {
            Some(p) => format!("{text} ({p})"),
            None => (*text).to_owned(),
        },
        None => code.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_codes_read_as_words_and_keep_their_parameter() {
        assert_eq!(
            explain("argument_not_vouched:to"),
            "an argument's value did not come from the user or a trusted source (to)"
        );
        assert_eq!(explain("revoked"), "revoked, with its whole subtree");
    }

    #[test]
    fn unknown_codes_are_shown_as_the_code() {
        assert_eq!(explain("brand_new_code:x"), "brand_new_code:x");
    }

    #[test]
    fn the_table_has_one_entry_per_code() {
        let mut kinds: Vec<_> = TABLE.iter().map(|(k, _)| *k).collect();
        kinds.sort_unstable();
        let n = kinds.len();
        kinds.dedup();
        assert_eq!(kinds.len(), n);
    }
}
