//! The agent hierarchy and effective capabilities.
//!
//! Agents form a forest: each has at most one parent, registered before it.
//! Registration validates the tree (unknown parent, duplicate id, cycle,
//! depth limit) and computes the agent's effective capabilities once:
//!
//! ```text
//! effective(root)  = environment ∩ declared(root)
//! effective(child) = effective(parent) ∩ declared(child) \ non_root_forbidden
//! ```
//!
//! which unrolls to the lab document's intersection over the whole lineage.
//! `non_root_forbidden` holds the actions no delegated agent may ever hold
//! (the block-write actions of delegation lockdown). Nodes live in a `Vec`
//! and point at their parent by index, so a lineage walk is pointer chasing
//! with no hashing.
//!
//! Ancestor questions never walk the lineage:
//!
//! - each node caches the union of what its lineage declares (`inherited`,
//!   a [`CapSet`]: `declared(self) ∪ inherited(parent)`), so "does the agent
//!   or an ancestor declare this action" ([`Hierarchy::lineage_declares`])
//!   is one bit test;
//! - every agent that has a child has its lineage stored root first in one
//!   shared arena (`paths`), written once when its first child registers
//!   (a copy of its parent's path plus itself, at most `max_depth` entries);
//!   a node keeps the offset of its parent's path, so "is `a` a strict
//!   ancestor of `b`" ([`Hierarchy::is_ancestor`]) is the one comparison
//!   `path(parent(b))[depth(a)] == a`. Leaves store no path, so the arena
//!   holds `depth + 1` entries per agent with children only.
//!
//! Revocation changes neither structure (ancestry and declarations stay;
//! the status is checked beside them); [`Hierarchy::set_declared`]
//! recomputes `inherited` with `effective` over the subtree.

use std::collections::BTreeSet;
use std::fmt;
use std::hash::BuildHasher as _;

use serde::{Deserialize, Serialize};

use crate::capability::CapSet;
use crate::decision::{Reason, reasons};
use crate::ids::{ActionName, AgentId};

/// Limits on the shape of the hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HierarchyLimits {
    /// The most agents a lineage (root to leaf, inclusive) may hold.
    pub max_depth: u32,
}

impl Default for HierarchyLimits {
    fn default() -> Self {
        Self { max_depth: 64 }
    }
}

/// What the caller asks to register.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentSpec {
    /// The new agent's id.
    pub id: AgentId,
    /// Its parent, if any.
    pub parent: Option<AgentId>,
    /// The capabilities it declares (unknown names grant nothing).
    pub capabilities: BTreeSet<ActionName>,
}

/// Whether an agent may act.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentStatus {
    /// It may act, within its capabilities.
    Active,
    /// It and its descendants are denied everything.
    Revoked,
}

impl AgentStatus {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentStatus::Active => "active",
            AgentStatus::Revoked => "revoked",
        }
    }
}

impl std::str::FromStr for AgentStatus {
    type Err = String;

    /// Parse the snake_case name ([`AgentStatus::as_str`]).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "active" => Ok(AgentStatus::Active),
            "revoked" => Ok(AgentStatus::Revoked),
            other => Err(format!("unknown agent status `{other}`")),
        }
    }
}

/// Position of an agent in the hierarchy's node table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentIdx(u32);

impl AgentIdx {
    fn get(self) -> usize {
        self.0 as usize
    }
}

/// One registered agent.
///
/// Laid out for a forest far larger than the cache: the fields every
/// decision reads (the id a lookup compares, the effective and inherited
/// capabilities, the status, the depth and the parent's path for ancestor
/// questions) fill the node's first cache line, and nodes start on a line,
/// so a question about a cold agent costs one line of its node.
#[derive(Debug, Clone)]
#[repr(C, align(64))]
pub struct AgentNode {
    // The first cache line: 24 + 16 + 16 + 4 + 2 + 1 bytes.
    id: AgentId,
    effective: CapSet,
    /// What the agent and its ancestors declare (catalogue indices).
    inherited: CapSet,
    /// Offset in `Hierarchy::paths` of its parent's lineage (`NO_PATH` for
    /// a root).
    parent_path: u32,
    depth: u16,
    status: AgentStatus,
    // The second line.
    parent: Option<AgentIdx>,
    declared: BTreeSet<ActionName>,
    children: Vec<AgentIdx>,
    /// Offset in `Hierarchy::paths` of its own lineage (root first), once
    /// it has a child; `NO_PATH` before.
    path: u32,
}

/// The most agents a lineage may hold, whatever
/// [`HierarchyLimits::max_depth`] says (a node keeps its depth in 16 bits).
pub const MAX_LINEAGE: u32 = 1 << 16;

/// No lineage stored (a leaf's own path, a root's parent path).
const NO_PATH: u32 = u32::MAX;

impl AgentNode {
    /// The agent's id.
    pub fn id(&self) -> &AgentId {
        &self.id
    }
    /// Its parent's index.
    pub fn parent(&self) -> Option<AgentIdx> {
        self.parent
    }
    /// The capabilities it declared.
    pub fn declared(&self) -> &BTreeSet<ActionName> {
        &self.declared
    }
    /// Its cached effective capabilities.
    pub fn effective(&self) -> &CapSet {
        &self.effective
    }
    /// The actions it or an ancestor declares (catalogue indices; names the
    /// catalogue does not know are not in it).
    pub fn inherited(&self) -> &CapSet {
        &self.inherited
    }
    /// 0 for a root, 1 for its children, ...
    #[inline]
    pub fn depth(&self) -> u32 {
        u32::from(self.depth)
    }
    /// Active or revoked.
    pub fn status(&self) -> AgentStatus {
        self.status
    }
    /// Whether the agent may act at all.
    pub fn is_active(&self) -> bool {
        self.status == AgentStatus::Active
    }
    /// Its direct children.
    pub fn children(&self) -> &[AgentIdx] {
        &self.children
    }
}

/// Why a registration or change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HierarchyError {
    /// The id is taken.
    #[error("agent `{0}` is already registered")]
    DuplicateAgent(AgentId),
    /// The parent is not registered.
    #[error("unknown parent `{parent}` for agent `{agent}`")]
    UnknownParent {
        /// The agent being registered.
        agent: AgentId,
        /// The missing parent.
        parent: AgentId,
    },
    /// The parent is revoked.
    #[error("parent `{parent}` of agent `{agent}` is revoked")]
    ParentRevoked {
        /// The agent being registered.
        agent: AgentId,
        /// The revoked parent.
        parent: AgentId,
    },
    /// The lineage would be too deep.
    #[error("agent `{agent}` would sit at depth {depth}, the limit is {limit}")]
    TooDeep {
        /// The agent being registered.
        agent: AgentId,
        /// The lineage length it would have.
        depth: u32,
        /// The configured limit.
        limit: u32,
    },
    /// The declared parents form a cycle.
    #[error("agent hierarchy contains a cycle through `{0}`")]
    Cycle(AgentId),
    /// The agent is not registered.
    #[error("unknown agent `{0}`")]
    UnknownAgent(String),
    /// The table is full (over 4 billion agents).
    #[error("agent table is full")]
    Full,
}

impl HierarchyError {
    /// The reason code a decision record carries for this refusal (the
    /// constants in [`reasons`]). A full agent table is recorded as
    /// `depth_exceeded`: both are the hierarchy's size limits.
    pub fn reason(&self) -> Reason {
        match self {
            HierarchyError::DuplicateAgent(_) => reasons::DUPLICATE_AGENT,
            HierarchyError::UnknownParent { .. } => reasons::UNKNOWN_PARENT,
            HierarchyError::ParentRevoked { .. } => reasons::PARENT_REVOKED,
            HierarchyError::TooDeep { .. } | HierarchyError::Full => reasons::DEPTH_EXCEEDED,
            HierarchyError::Cycle(_) => reasons::HIERARCHY_CYCLE,
            HierarchyError::UnknownAgent(_) => reasons::UNKNOWN_AGENT,
        }
    }
}

/// A registration that passed validation and can be committed infallibly.
#[derive(Debug, Clone)]
pub struct PreparedAgent {
    node: AgentNode,
}

impl PreparedAgent {
    /// The node that [`Hierarchy::commit`] will insert.
    pub fn node(&self) -> &AgentNode {
        &self.node
    }
}

/// What [`Hierarchy::place`] decides for a registration: everything of its
/// node but the id and the declared names.
struct Placed {
    /// The id's hash in the id table.
    hash: u64,
    parent: Option<AgentIdx>,
    depth: u16,
    effective: CapSet,
    inherited: CapSet,
}

impl Placed {
    fn into_prepared(self, id: AgentId, declared: BTreeSet<ActionName>) -> PreparedAgent {
        PreparedAgent {
            node: AgentNode {
                id,
                parent: self.parent,
                declared,
                effective: self.effective,
                inherited: self.inherited,
                depth: self.depth,
                status: AgentStatus::Active,
                children: Vec::new(),
                path: NO_PATH,
                parent_path: NO_PATH,
            },
        }
    }
}

/// Agent ids to their index: an open-addressed table of 8-byte slots, each
/// the high 32 bits of the id's hash beside the node's index plus one (0
/// marks an empty slot), probed linearly from the slot those hash bits
/// pick and kept at most half full. A lookup reads one slot (one cache
/// line, with its neighbours) and compares the id through the node only
/// where the hash bits match, so a question about a cold agent in a forest
/// far larger than the cache costs the slot's line and its node's first
/// line. Since a slot holds the bits that place it, growing the table moves
/// slots without hashing an id or reading a node.
///
/// Beside it, position for position, a table of 32-byte [`Place`]s (two to
/// a cache line): each full slot's copy, the node's [`Placement`] (its
/// depth and its parent's lineage, neither of which changes once the agent
/// is registered) and, for an id of at most [`INLINE_ID`] bytes, the id
/// itself. [`Hierarchy::placement_of`] probes that table alone, so where a
/// cold agent with a short id sits costs one cache line, not two dependent
/// ones; lookups that go on to the node ([`Hierarchy::index_of`], for
/// capabilities and status) keep to the small table, whose reach the
/// larger one would spoil.
#[derive(Clone, Default)]
struct IdIndex {
    /// A power of two long (or empty).
    slots: Vec<u64>,
    /// As long as `slots`; `places[i]` describes the agent of `slots[i]`.
    places: Vec<Place>,
    len: usize,
    state: foldhash::fast::RandomState,
}

/// The longest id the id table keeps beside an agent's placement (longer
/// ids are compared through their node).
pub const INLINE_ID: usize = 16;

/// `Place::id_len` of an id longer than [`INLINE_ID`].
const LONG_ID: u8 = u8::MAX;

/// Where the agent of one id-table slot sits, and its id if short.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
#[repr(C, align(32))]
struct Place {
    /// The slot's own value (hash bits and index plus one; 0 if empty).
    slot: u64,
    /// The node's `parent_path`.
    parent_path: u32,
    /// The node's depth.
    depth: u16,
    /// The id's length if it is at most [`INLINE_ID`] bytes, else
    /// [`LONG_ID`].
    id_len: u8,
    /// The id, if short, zero-padded.
    id: [u8; INLINE_ID],
}

impl Place {
    /// The placement it records (meaningful for a full slot only).
    #[inline]
    fn placement(self) -> Placement {
        Placement {
            idx: AgentIdx((self.slot as u32).wrapping_sub(1)),
            depth: self.depth,
            parent_path: self.parent_path,
        }
    }

    /// Whether this full place, whose hash bits match `id`'s, is `id`'s.
    #[inline]
    fn holds(&self, nodes: &[AgentNode], id: &str) -> bool {
        if self.id_len == LONG_ID {
            let idx = (self.slot as u32).wrapping_sub(1);
            return nodes.get(idx as usize).is_some_and(|n| n.id.as_str() == id);
        }
        self.id
            .get(..usize::from(self.id_len))
            .is_some_and(|own| own == id.as_bytes())
    }
}

/// Where an agent sits in the forest: its index, its depth and where its
/// parent's lineage is stored. Enough to answer whether one agent is
/// another's ancestor ([`Hierarchy::is_ancestor_of`]) without reading
/// either node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    idx: AgentIdx,
    depth: u16,
    parent_path: u32,
}

impl Placement {
    /// The agent's index.
    pub fn idx(&self) -> AgentIdx {
        self.idx
    }

    /// Its depth (0 for a root).
    pub fn depth(&self) -> u16 {
        self.depth
    }
}

impl fmt::Debug for IdIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdIndex").field("len", &self.len).finish()
    }
}

impl IdIndex {
    #[inline]
    fn slot(hash: u64, idx: AgentIdx) -> u64 {
        (hash & !u64::from(u32::MAX)) | (u64::from(idx.0) + 1)
    }

    /// Where the probe for a hash (or a slot, which keeps its high bits)
    /// starts.
    #[inline]
    fn start(hash: u64, mask: usize) -> usize {
        (hash >> 32) as usize & mask
    }

    #[inline]
    fn hash(&self, id: &str) -> u64 {
        self.state.hash_one(id)
    }

    #[inline]
    fn get(&self, nodes: &[AgentNode], id: &str) -> Option<AgentIdx> {
        self.get_hashed(nodes, id, self.hash(id))
    }

    /// [`IdIndex::get`] of an id whose [`IdIndex::hash`] is `hash`.
    #[inline]
    fn get_hashed(&self, nodes: &[AgentNode], id: &str, hash: u64) -> Option<AgentIdx> {
        let mask = self.slots.len().checked_sub(1)?;
        let tag = hash >> 32;
        let mut at = Self::start(hash, mask);
        loop {
            let slot = *self.slots.get(at)?;
            if slot == 0 {
                return None;
            }
            if slot >> 32 == tag {
                let idx = (slot as u32).wrapping_sub(1);
                if nodes.get(idx as usize).is_some_and(|n| n.id.as_str() == id) {
                    return Some(AgentIdx(idx));
                }
            }
            at = (at + 1) & mask;
        }
    }

    /// Where `id`'s agent sits, probing the places alone.
    #[inline]
    fn placement(&self, nodes: &[AgentNode], id: &str) -> Option<Placement> {
        let hash = self.hash(id);
        let mask = self.places.len().checked_sub(1)?;
        let tag = hash >> 32;
        let mut at = Self::start(hash, mask);
        loop {
            let place = *self.places.get(at)?;
            if place.slot == 0 {
                return None;
            }
            if place.slot >> 32 == tag && place.holds(nodes, id) {
                return Some(place.placement());
            }
            at = (at + 1) & mask;
        }
    }

    /// Add `id`, whose [`IdIndex::hash`] is `hash`, placed at `place`
    /// (its index below `u32::MAX`, the id not in the table yet).
    fn insert_hashed(&mut self, id: &str, hash: u64, place: Placement) {
        if (self.len + 1) * 2 > self.slots.len() {
            let size = (self.slots.len() * 2).max(16);
            self.slots = vec![0; size];
            let places = std::mem::replace(&mut self.places, vec![Place::default(); size]);
            for entry in places.into_iter().filter(|p| p.slot != 0) {
                self.place(entry);
            }
        }
        let mut entry = Place {
            slot: Self::slot(hash, place.idx),
            parent_path: place.parent_path,
            depth: place.depth,
            id_len: LONG_ID,
            id: [0; INLINE_ID],
        };
        if let (Some(own), Ok(len)) = (entry.id.get_mut(..id.len()), u8::try_from(id.len())) {
            own.copy_from_slice(id.as_bytes());
            entry.id_len = len;
        }
        self.place(entry);
        self.len += 1;
    }

    /// Put `entry` and its slot in the first empty position from where its
    /// hash bits point.
    fn place(&mut self, entry: Place) {
        let mask = self.slots.len() - 1;
        let mut at = Self::start(entry.slot, mask);
        while let (Some(s), Some(p)) = (self.slots.get_mut(at), self.places.get_mut(at)) {
            if *s == 0 {
                *s = entry.slot;
                *p = entry;
                return;
            }
            at = (at + 1) & mask;
        }
    }
}

/// The agent forest with cached effective capabilities.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    nodes: Vec<AgentNode>,
    /// The lineages (root first) of agents with children, end to end.
    paths: Vec<AgentIdx>,
    by_id: IdIndex,
    environment: CapSet,
    non_root_forbidden: CapSet,
    limits: HierarchyLimits,
}

impl Hierarchy {
    /// An empty hierarchy under the given environment capabilities.
    pub fn new(environment: CapSet, non_root_forbidden: CapSet, limits: HierarchyLimits) -> Self {
        Self {
            nodes: Vec::new(),
            paths: Vec::new(),
            by_id: IdIndex::default(),
            environment,
            non_root_forbidden,
            limits,
        }
    }

    /// The environment capabilities.
    pub fn environment(&self) -> &CapSet {
        &self.environment
    }

    /// The configured limits.
    pub fn limits(&self) -> HierarchyLimits {
        self.limits
    }

    /// Number of registered agents (active or revoked).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether no agent is registered.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Look an agent up by id.
    #[inline]
    pub fn index_of(&self, id: &str) -> Option<AgentIdx> {
        self.by_id.get(&self.nodes, id)
    }

    /// The node at `idx`.
    #[inline]
    pub fn node(&self, idx: AgentIdx) -> Option<&AgentNode> {
        self.nodes.get(idx.get())
    }

    /// Look an agent up by id.
    pub fn get(&self, id: &str) -> Option<&AgentNode> {
        self.index_of(id).and_then(|i| self.node(i))
    }

    /// All nodes, in registration order.
    pub fn iter(&self) -> impl Iterator<Item = (AgentIdx, &AgentNode)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| u32::try_from(i).ok().map(|i| (AgentIdx(i), n)))
    }

    /// The agent and its ancestors, nearest first.
    pub fn lineage(&self, idx: AgentIdx) -> Lineage<'_> {
        Lineage {
            hierarchy: self,
            next: Some(idx),
        }
    }

    /// Whether `ancestor` is a strict ancestor of `idx`, in constant time
    /// (one lookup in the parent's stored path).
    #[inline]
    pub fn is_ancestor(&self, ancestor: AgentIdx, idx: AgentIdx) -> bool {
        match (self.placement(ancestor), self.placement(idx)) {
            (Some(a), Some(p)) => self.is_ancestor_of(a, p),
            _ => false,
        }
    }

    /// [`Hierarchy::is_ancestor`] for agents placed at `ancestor` and `of`
    /// (from [`Hierarchy::placement`] or [`Hierarchy::placement_of`]):
    /// reads neither node, one entry of the lineage arena.
    #[inline]
    pub fn is_ancestor_of(&self, ancestor: Placement, of: Placement) -> bool {
        if ancestor.depth >= of.depth || of.parent_path == NO_PATH {
            return false;
        }
        let at = of.parent_path as usize + ancestor.depth as usize;
        self.paths.get(at) == Some(&ancestor.idx)
    }

    /// Where the agent at `idx` sits, read from its node.
    #[inline]
    pub fn placement(&self, idx: AgentIdx) -> Option<Placement> {
        self.node(idx).map(|n| Placement {
            idx,
            depth: n.depth,
            parent_path: n.parent_path,
        })
    }

    /// Where the agent `id` sits, or `None` if no agent has that id: for
    /// an id of at most [`INLINE_ID`] bytes, read from the id table alone,
    /// where a copy of the placement sits beside the id (one cache line
    /// for a cold agent, where [`Hierarchy::index_of`] then
    /// [`Hierarchy::placement`] read the id table's slot, then the node; a
    /// longer id is compared through its node).
    #[inline]
    pub fn placement_of(&self, id: &str) -> Option<Placement> {
        self.by_id.placement(&self.nodes, id)
    }

    /// Whether the agent is active and it or one of its ancestors declares
    /// the action with catalogue index `action`: one bit test, whatever
    /// the depth. (An active agent's ancestors are all active: revocation
    /// covers descendants and a revoked parent takes no children.)
    #[inline]
    pub fn lineage_declares(&self, idx: AgentIdx, action: u16) -> bool {
        self.node(idx)
            .is_some_and(|n| n.is_active() && n.inherited.contains(action))
    }

    /// Whether `idx` holds the capability with action index `action`.
    #[inline]
    pub fn has_capability(&self, idx: AgentIdx, action: u16) -> bool {
        self.node(idx)
            .is_some_and(|n| n.is_active() && n.effective.contains(action))
    }

    /// Validate a registration without changing anything.
    ///
    /// `index_of` maps an action name to its catalogue index; names it does
    /// not know grant nothing.
    pub fn prepare(
        &self,
        spec: &AgentSpec,
        index_of: &impl Fn(&ActionName) -> Option<u16>,
    ) -> Result<PreparedAgent, HierarchyError> {
        let placed = self.place(spec, index_of)?;
        Ok(placed.into_prepared(spec.id.clone(), spec.capabilities.clone()))
    }

    /// [`Hierarchy::prepare`] of a spec the caller gives up: its id and
    /// declared set move into the node instead of being copied.
    pub fn prepare_owned(
        &self,
        spec: AgentSpec,
        index_of: &impl Fn(&ActionName) -> Option<u16>,
    ) -> Result<PreparedAgent, HierarchyError> {
        let placed = self.place(&spec, index_of)?;
        Ok(placed.into_prepared(spec.id, spec.capabilities))
    }

    /// Where a registration would go and what it would hold, if it may.
    fn place(
        &self,
        spec: &AgentSpec,
        index_of: &impl Fn(&ActionName) -> Option<u16>,
    ) -> Result<Placed, HierarchyError> {
        let hash = self.by_id.hash(spec.id.as_str());
        if self
            .by_id
            .get_hashed(&self.nodes, spec.id.as_str(), hash)
            .is_some()
        {
            return Err(HierarchyError::DuplicateAgent(spec.id.clone()));
        }
        if u32::try_from(self.nodes.len()).is_err() {
            return Err(HierarchyError::Full);
        }
        let declared_set = CapSet::from_indices(spec.capabilities.iter().filter_map(index_of));
        let (parent, depth, effective, inherited) = match &spec.parent {
            None => (
                None,
                0,
                self.environment.intersection(&declared_set),
                declared_set,
            ),
            Some(parent_id) => {
                let pidx = self.index_of(parent_id.as_str()).ok_or_else(|| {
                    HierarchyError::UnknownParent {
                        agent: spec.id.clone(),
                        parent: parent_id.clone(),
                    }
                })?;
                let pnode = self
                    .node(pidx)
                    .ok_or_else(|| HierarchyError::UnknownAgent(parent_id.to_string()))?;
                if !pnode.is_active() {
                    return Err(HierarchyError::ParentRevoked {
                        agent: spec.id.clone(),
                        parent: parent_id.clone(),
                    });
                }
                let effective = pnode
                    .effective
                    .intersection(&declared_set)
                    .difference(&self.non_root_forbidden);
                let inherited = pnode.inherited.union(&declared_set);
                (Some(pidx), pnode.depth() + 1, effective, inherited)
            }
        };
        let limit = self.limits.max_depth.min(MAX_LINEAGE);
        let stored = u16::try_from(depth).ok().filter(|_| depth < limit);
        let Some(depth) = stored else {
            return Err(HierarchyError::TooDeep {
                agent: spec.id.clone(),
                depth: depth.saturating_add(1),
                limit,
            });
        };
        Ok(Placed {
            hash,
            parent,
            depth,
            effective,
            inherited,
        })
    }

    /// Insert a prepared agent. Must follow [`Hierarchy::prepare`] on the
    /// same, unchanged hierarchy.
    pub fn commit(&mut self, prepared: PreparedAgent) -> Result<AgentIdx, HierarchyError> {
        let node = prepared.node;
        let hash = self.by_id.hash(node.id.as_str());
        if self
            .by_id
            .get_hashed(&self.nodes, node.id.as_str(), hash)
            .is_some()
        {
            return Err(HierarchyError::DuplicateAgent(node.id));
        }
        self.insert(node, hash)
    }

    /// Insert `node`, whose id (hashed to `hash`) is not registered.
    fn insert(&mut self, mut node: AgentNode, hash: u64) -> Result<AgentIdx, HierarchyError> {
        let idx = u32::try_from(self.nodes.len())
            .ok()
            .filter(|i| *i < u32::MAX)
            .map(AgentIdx)
            .ok_or(HierarchyError::Full)?;
        if let Some(p) = node.parent {
            node.parent_path = self.path_of(p, &node.id)?;
            match self.nodes.get_mut(p.get()) {
                Some(parent) => parent.children.push(idx),
                None => return Err(HierarchyError::UnknownAgent(node.id.to_string())),
            }
        }
        let place = Placement {
            idx,
            depth: node.depth,
            parent_path: node.parent_path,
        };
        self.by_id.insert_hashed(node.id.as_str(), hash, place);
        self.nodes.push(node);
        Ok(idx)
    }

    /// The offset of `p`'s lineage in `paths`, storing it first if `p` had
    /// no child yet (its parent's path, then itself). `child` names the
    /// agent being registered, for the error.
    fn path_of(&mut self, p: AgentIdx, child: &AgentId) -> Result<u32, HierarchyError> {
        let missing = || HierarchyError::UnknownAgent(child.to_string());
        let parent = self.nodes.get(p.get()).ok_or_else(missing)?;
        if parent.path != NO_PATH {
            return Ok(parent.path);
        }
        let start = u32::try_from(self.paths.len()).map_err(|_| HierarchyError::Full)?;
        let end = u64::from(start) + u64::from(parent.depth) + 1;
        if end >= u64::from(NO_PATH) {
            return Err(HierarchyError::Full);
        }
        if parent.parent_path != NO_PATH {
            let from = parent.parent_path as usize;
            let to = from + parent.depth as usize;
            self.paths.extend_from_within(from..to);
        }
        self.paths.push(p);
        if let Some(parent) = self.nodes.get_mut(p.get()) {
            parent.path = start;
        }
        Ok(start)
    }

    /// Validate and insert in one step.
    pub fn register(
        &mut self,
        spec: &AgentSpec,
        index_of: &impl Fn(&ActionName) -> Option<u16>,
    ) -> Result<AgentIdx, HierarchyError> {
        // Placed on this very hierarchy, which nothing changes before the
        // insert: the id was found absent under the same hash.
        let placed = self.place(spec, index_of)?;
        let hash = placed.hash;
        let prepared = placed.into_prepared(spec.id.clone(), spec.capabilities.clone());
        self.insert(prepared.node, hash)
    }

    /// [`Hierarchy::register`] of a spec the caller gives up (see
    /// [`Hierarchy::prepare_owned`]).
    pub fn register_owned(
        &mut self,
        spec: AgentSpec,
        index_of: &impl Fn(&ActionName) -> Option<u16>,
    ) -> Result<AgentIdx, HierarchyError> {
        let placed = self.place(&spec, index_of)?;
        let hash = placed.hash;
        let prepared = placed.into_prepared(spec.id, spec.capabilities);
        self.insert(prepared.node, hash)
    }

    /// Register many agents given in any order (a policy bundle, a store
    /// being loaded): parents first, then children; an unknown parent or a
    /// cycle is an error and leaves `self` unchanged.
    pub fn register_all(
        &mut self,
        specs: &[AgentSpec],
        index_of: &impl Fn(&ActionName) -> Option<u16>,
    ) -> Result<Vec<AgentIdx>, HierarchyError> {
        let mut staged = self.clone();
        let mut pending: Vec<&AgentSpec> = specs.iter().collect();
        let mut seen = std::collections::HashSet::new();
        for s in specs {
            if !seen.insert(s.id.as_str()) {
                return Err(HierarchyError::DuplicateAgent(s.id.clone()));
            }
        }
        let mut order = Vec::with_capacity(specs.len());
        while !pending.is_empty() {
            let before = pending.len();
            let mut rest = Vec::new();
            for spec in pending {
                let ready = match &spec.parent {
                    None => true,
                    Some(p) => staged.index_of(p.as_str()).is_some(),
                };
                if ready {
                    order.push(staged.register(spec, index_of)?);
                } else {
                    rest.push(spec);
                }
            }
            if rest.len() == before {
                // Nothing progressed: every remaining agent waits on a parent
                // that is either missing or part of a cycle.
                let ids: std::collections::HashSet<&str> =
                    rest.iter().map(|s| s.id.as_str()).collect();
                for spec in &rest {
                    if let Some(p) = &spec.parent
                        && !ids.contains(p.as_str())
                    {
                        return Err(HierarchyError::UnknownParent {
                            agent: spec.id.clone(),
                            parent: p.clone(),
                        });
                    }
                }
                let first = rest
                    .first()
                    .map(|s| s.id.clone())
                    .ok_or(HierarchyError::Full)?;
                return Err(HierarchyError::Cycle(first));
            }
            pending = rest;
        }
        *self = staged;
        Ok(order)
    }

    /// Revoke an agent and all its descendants; returns the agents newly
    /// revoked, the given one first.
    pub fn revoke(&mut self, id: &str) -> Result<Vec<AgentId>, HierarchyError> {
        let root = self
            .index_of(id)
            .ok_or_else(|| HierarchyError::UnknownAgent(id.to_owned()))?;
        let mut revoked = Vec::new();
        let mut stack = vec![root];
        while let Some(idx) = stack.pop() {
            if let Some(node) = self.nodes.get_mut(idx.get()) {
                if node.status == AgentStatus::Active {
                    node.status = AgentStatus::Revoked;
                    revoked.push(node.id.clone());
                }
                stack.extend(node.children.iter().rev().copied());
            }
        }
        Ok(revoked)
    }

    /// Replace an agent's declared capabilities and recompute the effective
    /// and inherited sets of it and all its descendants.
    pub fn set_declared(
        &mut self,
        id: &str,
        capabilities: BTreeSet<ActionName>,
        index_of: &impl Fn(&ActionName) -> Option<u16>,
    ) -> Result<(), HierarchyError> {
        let root = self
            .index_of(id)
            .ok_or_else(|| HierarchyError::UnknownAgent(id.to_owned()))?;
        if let Some(node) = self.nodes.get_mut(root.get()) {
            node.declared = capabilities;
        }
        let mut stack = vec![root];
        while let Some(idx) = stack.pop() {
            let Some(node) = self.nodes.get(idx.get()) else {
                continue;
            };
            let declared = CapSet::from_indices(node.declared.iter().filter_map(index_of));
            let (effective, inherited) = match node.parent.and_then(|p| self.nodes.get(p.get())) {
                None => (self.environment.intersection(&declared), declared),
                Some(parent) => (
                    parent
                        .effective
                        .intersection(&declared)
                        .difference(&self.non_root_forbidden),
                    parent.inherited.union(&declared),
                ),
            };
            let children = node.children.clone();
            if let Some(node) = self.nodes.get_mut(idx.get()) {
                node.effective = effective;
                node.inherited = inherited;
            }
            stack.extend(children);
        }
        Ok(())
    }
}

/// Iterator over an agent and its ancestors, nearest first.
#[derive(Debug, Clone)]
pub struct Lineage<'h> {
    hierarchy: &'h Hierarchy,
    next: Option<AgentIdx>,
}

impl<'h> Iterator for Lineage<'h> {
    type Item = (AgentIdx, &'h AgentNode);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let idx = self.next?;
        let node = self.hierarchy.node(idx)?;
        self.next = node.parent;
        Some((idx, node))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str, parent: Option<&str>) -> AgentSpec {
        AgentSpec {
            id: AgentId::parse(id).unwrap(),
            parent: parent.map(|p| AgentId::parse(p).unwrap()),
            capabilities: BTreeSet::new(),
        }
    }

    fn no_actions(_: &ActionName) -> Option<u16> {
        None
    }

    #[test]
    fn every_refusal_names_the_reason_the_engine_records() {
        let mut h = Hierarchy::new(
            CapSet::new(),
            CapSet::new(),
            HierarchyLimits { max_depth: 2 },
        );
        h.register(&spec("root", None), &no_actions).unwrap();
        h.register(&spec("child", Some("root")), &no_actions)
            .unwrap();
        h.register(&spec("gone", Some("root")), &no_actions)
            .unwrap();
        h.revoke("gone").unwrap();
        let before = h.len();

        let refused = [
            (spec("root", None), "duplicate_agent"),
            (spec("orphan", Some("nobody")), "unknown_parent"),
            (spec("late", Some("gone")), "parent_revoked"),
            (spec("grandchild", Some("child")), "depth_exceeded"),
        ];
        for (s, code) in refused {
            let err = h.register(&s, &no_actions).unwrap_err();
            assert_eq!(err.reason().as_str(), code, "{err}");
        }
        assert_eq!(h.len(), before, "a refused registration changes nothing");

        let err = h.revoke("nobody").unwrap_err();
        assert_eq!(err.reason(), reasons::UNKNOWN_AGENT);

        let mut bulk = Hierarchy::new(CapSet::new(), CapSet::new(), HierarchyLimits::default());
        let err = bulk
            .register_all(&[spec("a", Some("b")), spec("b", Some("a"))], &no_actions)
            .unwrap_err();
        assert_eq!(err.reason(), reasons::HIERARCHY_CYCLE);
        assert!(bulk.is_empty());
        assert_eq!(HierarchyError::Full.reason(), reasons::DEPTH_EXCEEDED);
    }

    #[test]
    fn what_a_decision_reads_sits_in_the_first_cache_line_of_a_node() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(align_of::<AgentNode>(), 64);
        assert_eq!(size_of::<AgentNode>(), 128);
        for (field, end) in [
            ("id", offset_of!(AgentNode, id) + size_of::<AgentId>()),
            (
                "effective",
                offset_of!(AgentNode, effective) + size_of::<CapSet>(),
            ),
            (
                "inherited",
                offset_of!(AgentNode, inherited) + size_of::<CapSet>(),
            ),
            ("parent_path", offset_of!(AgentNode, parent_path) + 4),
            ("depth", offset_of!(AgentNode, depth) + 2),
            ("status", offset_of!(AgentNode, status) + 1),
        ] {
            assert!(end <= 64, "{field} ends at byte {end}");
        }
    }

    #[test]
    fn every_agent_is_found_by_its_id_through_the_table_growing() {
        let mut h = Hierarchy::new(CapSet::new(), CapSet::new(), HierarchyLimits::default());
        // Past several growths of the id table (each moves every slot by
        // the hash bits it keeps).
        let ids: Vec<String> = (0..3_000).map(|i| format!("agent-{i}")).collect();
        for (i, id) in ids.iter().enumerate() {
            let parent = (i > 0).then(|| ids[(i - 1) / 2].as_str());
            let idx = h.register(&spec(id, parent), &no_actions).unwrap();
            assert_eq!(h.index_of(id), Some(idx));
        }
        for (i, id) in ids.iter().enumerate() {
            let idx = h.index_of(id).unwrap();
            assert_eq!(idx.get(), i);
            assert_eq!(h.node(idx).map(|n| n.id().as_str()), Some(id.as_str()));
        }
        for absent in ["agent-3000", "agent-", "", "Agent-1", "agent-01"] {
            assert_eq!(h.index_of(absent), None, "{absent}");
        }
        let err = h
            .register(&spec("agent-17", None), &no_actions)
            .unwrap_err();
        assert_eq!(err.reason().as_str(), "duplicate_agent");
        let err = h
            .register_owned(spec("agent-2999", Some("agent-0")), &no_actions)
            .unwrap_err();
        assert_eq!(err.reason().as_str(), "duplicate_agent");
        // Prepared while absent, committed after the same id was
        // registered: the commit looks again and refuses it.
        let prepared = h.prepare(&spec("late", None), &no_actions).unwrap();
        h.register(&spec("late", None), &no_actions).unwrap();
        let err = h.commit(prepared).unwrap_err();
        assert_eq!(err.reason().as_str(), "duplicate_agent");
        assert_eq!(h.len(), ids.len() + 1);
    }

    mod ancestry {
        //! The constant-time ancestor answers against the lineage walk, over
        //! random forests and sequences of registrations, revocations and
        //! declaration changes.

        use super::*;
        use proptest::prelude::*;

        const ACTIONS: [&str; 5] = ["a.one", "a.two", "a.three", "a.four", "not.in.catalogue"];

        fn index_of(a: &ActionName) -> Option<u16> {
            // The last name is unknown to the catalogue: it grants nothing.
            ACTIONS[..4]
                .iter()
                .position(|x| *x == a.as_str())
                .and_then(|i| u16::try_from(i).ok())
        }

        fn caps(mask: u8) -> BTreeSet<ActionName> {
            ACTIONS
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, n)| ActionName::parse(n).unwrap())
                .collect()
        }

        #[derive(Debug, Clone)]
        enum Op {
            /// Register `a<next>` under the agent picked (or as a root).
            Register(Option<prop::sample::Index>, u8),
            Revoke(prop::sample::Index),
            SetDeclared(prop::sample::Index, u8),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                6 => (prop::option::weighted(0.9, any::<prop::sample::Index>()), any::<u8>())
                    .prop_map(|(p, m)| Op::Register(p, m)),
                1 => any::<prop::sample::Index>().prop_map(Op::Revoke),
                1 => (any::<prop::sample::Index>(), any::<u8>())
                    .prop_map(|(i, m)| Op::SetDeclared(i, m)),
            ]
        }

        /// The walk: `a` is met on `b`'s lineage above `b`.
        fn walk_is_ancestor(h: &Hierarchy, a: AgentIdx, b: AgentIdx) -> bool {
            h.lineage(b).skip(1).any(|(i, _)| i == a)
        }

        /// The walk: the agent is active and something on its lineage
        /// declares the action by a name the catalogue knows.
        fn walk_declares(h: &Hierarchy, idx: AgentIdx, action: u16) -> bool {
            h.node(idx).is_some_and(|n| n.is_active())
                && h.lineage(idx)
                    .any(|(_, n)| n.declared().iter().any(|d| index_of(d) == Some(action)))
        }

        fn check(h: &Hierarchy) -> Result<(), TestCaseError> {
            let all: Vec<AgentIdx> = h.iter().map(|(i, _)| i).collect();
            for &b in &all {
                for &a in &all {
                    prop_assert_eq!(
                        h.is_ancestor(a, b),
                        walk_is_ancestor(h, a, b),
                        "is_ancestor({:?}, {:?})",
                        a,
                        b
                    );
                }
                for action in 0..5u16 {
                    prop_assert_eq!(
                        h.lineage_declares(b, action),
                        walk_declares(h, b, action),
                        "lineage_declares({:?}, {})",
                        b,
                        action
                    );
                }
                // Nothing out of range is anybody's ancestor.
                prop_assert!(!h.is_ancestor(AgentIdx(u32::MAX - 1), b));
                prop_assert!(!h.is_ancestor(b, AgentIdx(u32::MAX - 1)));
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

            #[test]
            fn constant_time_answers_equal_the_walk(
                ops in prop::collection::vec(op(), 1..60),
                max_depth in 2u32..8,
            ) {
                let mut h = Hierarchy::new(
                    CapSet::from_indices([0, 1, 2]),
                    CapSet::new(),
                    HierarchyLimits { max_depth },
                );
                let mut next = 0usize;
                for op in ops {
                    let ids: Vec<AgentId> = h.iter().map(|(_, n)| n.id().clone()).collect();
                    match op {
                        Op::Register(parent, mask) => {
                            let parent = match parent {
                                Some(p) if !ids.is_empty() => Some(ids[p.index(ids.len())].clone()),
                                _ => None,
                            };
                            let spec = AgentSpec {
                                id: AgentId::parse(&format!("a{next}")).unwrap(),
                                parent,
                                capabilities: caps(mask),
                            };
                            next += 1;
                            let before = h.len();
                            // The same registration, the spec given up: the
                            // same outcome and the same forest.
                            let mut owned = h.clone();
                            let by_value = owned.register_owned(spec.clone(), &index_of);
                            let by_ref = h.register(&spec, &index_of);
                            prop_assert_eq!(&by_value, &by_ref);
                            prop_assert_eq!(format!("{owned:?}"), format!("{h:?}"));
                            // Refusals (too deep, revoked parent) change nothing.
                            if by_ref.is_err() {
                                prop_assert_eq!(h.len(), before);
                            }
                        }
                        Op::Revoke(i) if !ids.is_empty() => {
                            h.revoke(ids[i.index(ids.len())].as_str()).unwrap();
                        }
                        Op::SetDeclared(i, mask) if !ids.is_empty() => {
                            h.set_declared(ids[i.index(ids.len())].as_str(), caps(mask), &index_of)
                                .unwrap();
                        }
                        Op::Revoke(_) | Op::SetDeclared(..) => {}
                    }
                    check(&h)?;
                }
            }

            /// A bulk load in any order answers like the same agents
            /// registered one by one.
            #[test]
            fn bulk_loads_answer_like_the_walk(
                parents in prop::collection::vec((any::<prop::sample::Index>(), any::<bool>(), any::<u8>()), 1..40),
                shuffle in any::<prop::sample::Index>(),
            ) {
                let mut specs: Vec<AgentSpec> = parents
                    .iter()
                    .enumerate()
                    .map(|(i, (p, root, mask))| AgentSpec {
                        id: AgentId::parse(&format!("a{i}")).unwrap(),
                        parent: (i > 0 && !root)
                            .then(|| AgentId::parse(&format!("a{}", p.index(i))).unwrap()),
                        capabilities: caps(*mask),
                    })
                    .collect();
                let k = shuffle.index(specs.len());
                specs.rotate_left(k);
                let mut h = Hierarchy::new(CapSet::from_indices([0, 1, 2, 3]), CapSet::new(), HierarchyLimits::default());
                h.register_all(&specs, &index_of).unwrap();
                check(&h)?;
            }
        }

        #[test]
        fn a_deep_chain_answers_at_every_depth() {
            let mut h = Hierarchy::new(CapSet::new(), CapSet::new(), HierarchyLimits::default());
            let mut parent = None;
            for i in 0..64 {
                let spec = AgentSpec {
                    id: AgentId::parse(&format!("c{i}")).unwrap(),
                    parent: parent.clone(),
                    capabilities: if i == 0 { caps(1) } else { BTreeSet::new() },
                };
                h.register(&spec, &index_of).unwrap();
                parent = Some(spec.id);
            }
            let leaf = h.index_of("c63").unwrap();
            let root = h.index_of("c0").unwrap();
            assert!(h.is_ancestor(root, leaf));
            assert!(!h.is_ancestor(leaf, root));
            assert!(!h.is_ancestor(leaf, leaf));
            assert!(h.lineage_declares(leaf, 0));
            assert!(!h.lineage_declares(leaf, 1));
            h.revoke("c40").unwrap();
            assert!(
                !h.lineage_declares(leaf, 0),
                "a revoked agent declares nothing"
            );
            assert!(h.is_ancestor(root, leaf), "revocation keeps ancestry");
            // 63 agents with a child store 1 + 2 + ... + 63 entries.
            assert_eq!(h.paths.len(), 63 * 64 / 2);
        }
    }

    /// Every agent's place says where it sits as its node does, whatever
    /// its id's length (kept in the place up to `INLINE_ID` bytes,
    /// compared through the node past it); ids one byte longer or shorter,
    /// or one byte different, are not found.
    #[test]
    fn ids_of_every_length_are_placed_as_their_nodes_say() {
        let mut h = Hierarchy::new(CapSet::new(), CapSet::new(), HierarchyLimits::default());
        // Two places to a cache line.
        assert_eq!(std::mem::size_of::<Place>(), 32);
        // "1", "2-", "3-x", ..., "40-xx...x", then 63, 64, 127 and 128 bytes.
        let lengths: Vec<usize> = (1..=40).chain([63, 64, 127, 128]).collect();
        let ids: Vec<String> = lengths
            .iter()
            .map(|&len| {
                let stem = format!("{len}-");
                let long = format!("{stem}{}", "x".repeat(len.saturating_sub(stem.len())));
                long.chars().take(len).collect()
            })
            .collect();
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(Some(&id.len()), lengths.get(i));
            // A chain for the first half, a fan under agent 3 after it.
            let parent = match i {
                0 => None,
                1..=20 => Some(ids[i - 1].as_str()),
                _ => Some(ids[3].as_str()),
            };
            h.register(&spec(id, parent), &no_actions).unwrap();
        }
        for id in &ids {
            let idx = h.index_of(id).unwrap();
            assert_eq!(h.node(idx).unwrap().id().as_str(), id);
            let place = h.placement_of(id).unwrap();
            assert_eq!(Some(place), h.placement(idx), "{id}");
            assert_eq!(usize::from(place.depth()), h.lineage(idx).count() - 1);
            for other in &ids {
                let a = h.index_of(other).unwrap();
                let at = h.placement_of(other).unwrap();
                assert_eq!(
                    h.is_ancestor_of(at, place),
                    h.is_ancestor(a, idx),
                    "{other} over {id}"
                );
            }
            let mut longer = id.clone();
            longer.push('x');
            let mut changed = id.clone().into_bytes();
            if let Some(last) = changed.last_mut() {
                *last = if *last == b'y' { b'z' } else { b'y' };
            }
            let changed = String::from_utf8(changed).unwrap();
            for absent in [&longer, &id[..id.len() - 1], &changed] {
                if ids.iter().any(|i| i == absent) {
                    continue;
                }
                assert_eq!(h.index_of(absent), None, "{absent}");
                assert_eq!(h.placement_of(absent), None, "{absent}");
            }
        }
    }

    /// Two ids whose hash bits are the same sit in neighbouring slots and
    /// are told apart (by `index_of` through the node; by `placement_of` in
    /// the place for short ids, through the node for long ones), whichever
    /// was registered first.
    #[test]
    fn ids_whose_hash_bits_match_are_told_apart() {
        let mut h = Hierarchy::new(CapSet::new(), CapSet::new(), HierarchyLimits::default());
        h.register(&spec("root", None), &no_actions).unwrap();
        // Two pairs of ids of one length with the same high 32 hash bits
        // under this table's keys: short ones and long ones (by the
        // birthday bound, about 2^17 ids give two such pairs of each kind).
        let pair = |stem: &str| -> (String, String) {
            let mut seen = std::collections::HashMap::new();
            for i in 0u32..1 << 20 {
                // All of one length, so that only their bytes differ.
                let id = format!("{stem}{i:07}");
                if let Some(first) = seen.insert(h.by_id.hash(&id) >> 32, id.clone()) {
                    return (first, id);
                }
            }
            panic!("no two of 2^20 ids share 32 hash bits");
        };
        let (short_a, short_b) = pair("s");
        let (long_a, long_b) = pair("an-id-longer-than-the-slot-holds-");
        assert!(short_a.len() == short_b.len() && short_b.len() <= INLINE_ID);
        assert!(long_a.len() == long_b.len() && long_a.len() > INLINE_ID);
        for id in [&short_a, &short_b, &long_b, &long_a] {
            assert_eq!(h.index_of(id), None);
            h.register(&spec(id, Some("root")), &no_actions).unwrap();
        }
        for id in [&short_a, &short_b, &long_a, &long_b] {
            let idx = h.index_of(id).unwrap();
            assert_eq!(h.node(idx).unwrap().id().as_str(), id.as_str());
            assert_eq!(h.placement_of(id), h.placement(idx));
        }
        let err = h
            .register(&spec(&short_b, Some("root")), &no_actions)
            .unwrap_err();
        assert_eq!(err.reason().as_str(), "duplicate_agent");
    }
}
