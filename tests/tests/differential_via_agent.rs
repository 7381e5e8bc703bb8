//! The `differential` suite again, with every `ipkeep` call (and admin command) going through one
//! running `ipkeep-agent`: both paths must give the same answers (see `ipkeep_tests::via_agent`).

#[path = "differential.rs"]
mod suite;

/// The suite above really goes through the agent.
#[test]
fn commands_reach_the_agent() {
    ipkeep_tests::agent::assert_commands_reach_the_agent();
}
