//! The lockdown normaliser and the write-surface check: never panic; the
//! canonical spelling is a fixed point; invisible
//! characters inserted anywhere never change the verdict; a bundle
//! vocabulary only adds to the built-in one; the self-edit flag check never
//! panics on a config and sanitising leaves no flag `true`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warden_core::lockdown::{
    LockdownSpec, Preset, Vocabulary, canonical_name, is_self_edit_key,
    is_write_surface_tool_name, requests_self_edit, sanitise_child_config,
};

fuzz_target!(|data: &[u8]| {
    let Some((&at, rest)) = data.split_first() else {
        return;
    };
    let name = String::from_utf8_lossy(rest);
    let canonical = canonical_name(&name);
    assert_eq!(canonical_name(&canonical), canonical, "not a fixed point");
    let verdict = is_write_surface_tool_name(&name);

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
        assert_eq!(is_write_surface_tool_name(&variant), verdict, "invisible changed {variant:?}");
    }

    // A vocabulary with every preset and the name itself only adds.
    let spec = LockdownSpec {
        presets: Preset::ALL.to_vec(),
        write_surface_names: vec![name.chars().take(64).collect()],
        write_surface_patterns: Vec::new(),
    };
    if let Ok(v) = Vocabulary::compile(&spec) {
        assert!(!verdict || v.is_write_surface(&name), "a bundle removed a write");
        if name.len() <= 64 && !canonical.is_empty() {
            assert!(v.is_write_surface(&name), "a listed name is not caught");
        }
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
