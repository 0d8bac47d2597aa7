//! The lockdown normaliser and the write-surface check: never panic; the
//! canonical spelling is a fixed point; invisible characters inserted
//! anywhere never change the verdict, of the built-in vocabulary or of a
//! bundle's; a bundle vocabulary only adds to the built-in one; a name a
//! bundle lists (as a name, or as a pattern) is caught; the self-edit flag
//! check never panics on a config and sanitising leaves no flag `true`.
//!
//! A vocabulary with every preset and a few names and patterns is compiled
//! once per process; every input is matched against it. One input in four
//! also compiles a vocabulary of its own (the input as a listed name and as
//! a pattern, with the presets its first byte picks).
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use warden_core::lockdown::{
    LockdownSpec, Preset, Vocabulary, canonical_name, is_self_edit_key, is_write_surface_tool_name,
    requests_self_edit, sanitise_child_config,
};

/// Every preset, two names and two patterns, compiled once.
static BUNDLE: LazyLock<Vocabulary> = LazyLock::new(|| {
    Vocabulary::compile(&LockdownSpec {
        presets: Preset::ALL.to_vec(),
        write_surface_names: vec!["persona_edit".to_owned(), "srv.set_rules".to_owned()],
        write_surface_patterns: vec!["*persona*".to_owned(), "rules*write".to_owned()],
    })
    .expect("the fixed vocabulary compiles")
});

fuzz_target!(|data: &[u8]| {
    let Some((&at, rest)) = data.split_first() else {
        return;
    };
    let name = String::from_utf8_lossy(rest);
    let canonical = canonical_name(&name);
    assert_eq!(canonical_name(&canonical), canonical, "not a fixed point");
    let verdict = is_write_surface_tool_name(&name);
    let bundle = BUNDLE.is_write_surface(&name);
    assert!(!verdict || bundle, "a bundle removed a write");

    // An invisible character inserted after any character.
    let chars: Vec<char> = name.chars().collect();
    let cut = usize::from(at) % (chars.len() + 1);
    let invisible = ['\u{200b}', '\u{200d}', '\u{2060}', '\u{feff}', '\u{ad}'][usize::from(at) % 5];
    let mut variant: String = chars.iter().take(cut).collect();
    variant.push(invisible);
    variant.extend(chars.iter().skip(cut));
    // Only a non-ASCII character can compose with the one before it, which
    // the inserted character would prevent.
    if chars.get(cut).is_none_or(char::is_ascii) {
        assert_eq!(
            is_write_surface_tool_name(&variant),
            verdict,
            "invisible changed {variant:?}"
        );
        assert_eq!(
            BUNDLE.is_write_surface(&variant),
            bundle,
            "invisible changed {variant:?} (bundle)"
        );
    }

    // One input in four: a vocabulary of its own, with the presets the
    // first byte picks, the name itself and the name as a pattern.
    if at % 4 == 0 {
        let presets = Preset::ALL
            .iter()
            .enumerate()
            .filter(|(i, _)| (at >> (2 + i)) & 1 == 1)
            .map(|(_, p)| *p)
            .collect();
        let listed: String = name.chars().take(64).collect();
        let spec = LockdownSpec {
            presets,
            write_surface_names: vec![listed.clone()],
            write_surface_patterns: vec![listed.clone()],
        };
        let own = Vocabulary::compile(&spec);
        let names_only = Vocabulary::compile(&LockdownSpec {
            write_surface_patterns: Vec::new(),
            ..spec.clone()
        });
        if let Ok(v) = &names_only {
            assert!(
                !verdict || v.is_write_surface(&name),
                "a bundle removed a write"
            );
            if listed == name && !canonical.is_empty() {
                assert!(v.is_write_surface(&name), "a listed name is not caught");
            }
        }
        if let Ok(v) = &own {
            assert!(
                names_only.is_ok(),
                "names refused alone but accepted with patterns"
            );
            if listed == name {
                assert!(v.is_write_surface(&name), "a listed pattern is not caught");
            }
        }
        // Compiling is deterministic.
        assert_eq!(Vocabulary::compile(&spec).ok(), own.ok(), "compile differs");
    }

    // The name as a config key, at the top and nested.
    let _ = is_self_edit_key(&name);
    let config = serde_json::json!({ name.as_ref(): true, "n": [{ name.as_ref(): true }] });
    if let Ok(asked) = requests_self_edit(&config) {
        let out = sanitise_child_config(&config).expect("checked above");
        assert_eq!(out.was_sanitised(), asked);
        assert_eq!(requests_self_edit(out.config()), Ok(false));
    }
});
