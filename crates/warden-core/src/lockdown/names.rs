//! The tool-name check with the built-in vocabulary alone (the rules are in
//! the module docs of [`crate::lockdown`]).

use super::vocabulary::Vocabulary;

/// Whether a tool called `name` may write a prompt block, by the built-in
/// vocabulary alone.
///
/// A caller that has a [`Policy`](crate::bundle::Policy) should ask its
/// vocabulary instead ([`Policy::lockdown`](crate::bundle::Policy::lockdown),
/// [`Vocabulary::is_write_surface`]), which adds the bundle's presets, names
/// and patterns; this function is that check for the empty `lockdown:`
/// section.
pub fn is_write_surface_tool_name(name: &str) -> bool {
    Vocabulary::builtin().is_write_surface(name)
}
