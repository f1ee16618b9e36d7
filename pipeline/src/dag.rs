//! The graph: stages, the edges their inputs imply, a topological order and cycle refusal.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::stage::{InputSource, Stage};

/// A validated DAG of stages.
pub struct Graph {
    stages: Vec<Arc<dyn Stage>>,
    /// For each stage (by index), the indices of the stages it reads from.
    parents: Vec<BTreeSet<usize>>,
    order: Vec<usize>,
}

impl Graph {
    /// Builds a graph, refusing duplicate names, dangling inputs and cycles.
    pub fn new(stages: Vec<Arc<dyn Stage>>) -> Result<Self> {
        let mut index = BTreeMap::new();
        for (i, s) in stages.iter().enumerate() {
            if index.insert(s.name().to_string(), i).is_some() {
                return Err(Error::DuplicateStage(s.name().to_string()));
            }
        }
        let mut parents = vec![BTreeSet::new(); stages.len()];
        for (i, s) in stages.iter().enumerate() {
            for input in s.inputs() {
                if let InputSource::Artifact { stage, output } = &input.source {
                    let Some(&p) = index.get(stage) else {
                        return Err(dangling(s.name(), &input.name, stage, output));
                    };
                    if !stages[p].outputs().iter().any(|o| o == output) {
                        return Err(dangling(s.name(), &input.name, stage, output));
                    }
                    parents[i].insert(p);
                }
            }
        }
        let order = topo_order(&stages, &parents)?;
        Ok(Graph {
            stages,
            parents,
            order,
        })
    }

    /// The stages in a topological order (ancestors first, ties by declaration order).
    pub fn order(&self) -> impl Iterator<Item = &Arc<dyn Stage>> {
        self.order.iter().map(|&i| &self.stages[i])
    }

    /// The number of stages.
    pub fn len(&self) -> usize {
        self.stages.len()
    }

    /// Whether the graph has no stage.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// The stage at `index` (declaration order).
    pub fn stage(&self, index: usize) -> &Arc<dyn Stage> {
        &self.stages[index]
    }

    /// The indices of the stages that `index` reads from.
    pub fn parents(&self, index: usize) -> &BTreeSet<usize> {
        &self.parents[index]
    }

    /// The index of the stage named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.stages.iter().position(|s| s.name() == name)
    }

    /// The names of every stage downstream of `name` (not including it).
    pub fn descendants(&self, name: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let Some(start) = self.index_of(name) else {
            return out;
        };
        let mut frontier = vec![start];
        while let Some(n) = frontier.pop() {
            for (i, ps) in self.parents.iter().enumerate() {
                if ps.contains(&n) && out.insert(self.stages[i].name().to_string()) {
                    frontier.push(i);
                }
            }
        }
        out
    }
}

fn dangling(stage: &str, input: &str, from: &str, output: &str) -> Error {
    Error::DanglingInput {
        stage: stage.to_string(),
        input: input.to_string(),
        from_stage: from.to_string(),
        output: output.to_string(),
    }
}

/// Kahn's algorithm; on a cycle, walks parent links from a leftover node to name the cycle.
fn topo_order(stages: &[Arc<dyn Stage>], parents: &[BTreeSet<usize>]) -> Result<Vec<usize>> {
    let n = stages.len();
    let mut indegree: Vec<usize> = parents.iter().map(BTreeSet::len).collect();
    let mut order = Vec::with_capacity(n);
    let mut ready: BTreeSet<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for (j, ps) in parents.iter().enumerate() {
            if ps.contains(&i) {
                indegree[j] -= 1;
                if indegree[j] == 0 {
                    ready.insert(j);
                }
            }
        }
    }
    if order.len() == n {
        return Ok(order);
    }
    // Every leftover node has a leftover parent: follow them until a node repeats.
    let leftover: BTreeSet<usize> = (0..n).filter(|i| !order.contains(i)).collect();
    let mut path = Vec::new();
    let mut at = *leftover
        .first()
        .ok_or_else(|| Error::Internal("cycle without nodes".into()))?;
    loop {
        if let Some(pos) = path.iter().position(|&p| p == at) {
            // Walked child → parent; reverse to read in data-flow order, and start at the
            // earliest-declared stage so the message is stable.
            let mut ring: Vec<usize> = path[pos..].iter().rev().copied().collect();
            let start = ring
                .iter()
                .enumerate()
                .min_by_key(|(_, i)| **i)
                .map_or(0, |(p, _)| p);
            ring.rotate_left(start);
            let mut cycle: Vec<String> =
                ring.iter().map(|&i| stages[i].name().to_string()).collect();
            cycle.push(cycle[0].clone());
            return Err(Error::Cycle { cycle });
        }
        path.push(at);
        at = *parents[at]
            .iter()
            .find(|p| leftover.contains(p))
            .ok_or_else(|| Error::Internal("cycle walk lost its way".into()))?;
    }
}
