//! Bearer tokens: insert, find, revoke, duplicates.

use super::*;

fn token(token_id: &str, secret: &str, subject: TokenSubject) -> TokenRecord {
    TokenRecord {
        token_id: token_id.to_string(),
        hash: Digest::of(secret.as_bytes()),
        subject,
        created_at: Timestamp(5),
        revoked: false,
    }
}

/// Tokens are found by hash; revocation is reported once and audited once.
pub async fn tokens_insert_find_revoke<S: Store>(store: S) {
    let op = token("tok-op", "operator-secret", TokenSubject::Operator);
    let ag = token(
        "tok-a",
        "agent-secret",
        TokenSubject::Agent(id("researcher")),
    );
    for t in [&op, &ag] {
        store
            .insert_token(
                t.clone(),
                vec![draft(
                    "@operator",
                    "token.issue",
                    &t.token_id,
                    Verdict::Allow,
                    "issued",
                )],
            )
            .await
            .unwrap();
    }
    assert_eq!(store.find_token(op.hash).await.unwrap(), Some(op.clone()));
    assert_eq!(store.find_token(ag.hash).await.unwrap(), Some(ag.clone()));
    assert_eq!(store.find_token(Digest::of(b"nope")).await.unwrap(), None);
    assert_eq!(head_count(&store).await, 2);

    let revoke = || {
        vec![draft(
            "@operator",
            "token.revoke",
            "tok-a",
            Verdict::Allow,
            "revoked",
        )]
    };
    assert!(store.revoke_token("tok-a".into(), revoke()).await.unwrap());
    assert_eq!(head_count(&store).await, 3);
    let found = store.find_token(ag.hash).await.unwrap().unwrap();
    assert!(found.revoked);
    assert_eq!(found.subject, ag.subject);
    assert!(!store.find_token(op.hash).await.unwrap().unwrap().revoked);
    // Revoking again, or an unknown token, reports false and appends nothing.
    assert!(!store.revoke_token("tok-a".into(), revoke()).await.unwrap());
    assert!(
        !store
            .revoke_token("tok-ghost".into(), revoke())
            .await
            .unwrap()
    );
    assert_eq!(head_count(&store).await, 3);
    assert_chain(&store).await;
}

/// A token whose id or hash exists is `Duplicate` and changes nothing.
pub async fn tokens_duplicate_is_rejected<S: Store>(store: S) {
    let t = token("tok-1", "s1", TokenSubject::Operator);
    store.insert_token(t.clone(), vec![]).await.unwrap();
    let audit = || {
        vec![draft(
            "@operator",
            "token.issue",
            "x",
            Verdict::Allow,
            "issued",
        )]
    };
    let same_hash = token("tok-2", "s1", TokenSubject::Agent(id("a")));
    let err = store.insert_token(same_hash, audit()).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Duplicate { entity: Entity::Token, ref id } if id == "tok-2"),
        "{err:?}"
    );
    let same_id = token("tok-1", "s2", TokenSubject::Operator);
    let err = store.insert_token(same_id, audit()).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Duplicate { entity: Entity::Token, ref id } if id == "tok-1"),
        "{err:?}"
    );
    assert_eq!(store.find_token(Digest::of(b"s2")).await.unwrap(), None);
    assert_eq!(store.find_token(t.hash).await.unwrap(), Some(t));
    assert_eq!(head_count(&store).await, 0);
}
