use super::*;

#[test]
fn local_rank_comes_from_the_first_launcher_variable() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |var: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
        }
    };
    assert_eq!(local_rank_from(env(&[])), None);
    assert_eq!(local_rank_from(env(&[("LOCAL_RANK", "3")])), Some(3));
    assert_eq!(
        local_rank_from(env(&[
            ("LOCAL_RANK", "3"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1")
        ])),
        Some(1)
    );
    assert_eq!(local_rank_from(env(&[("LOCAL_RANK", "x")])), None);
}
