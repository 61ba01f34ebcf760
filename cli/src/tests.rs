use super::*;

#[test]
fn the_command_line_is_consistent() {
    command_line().debug_assert();
}
