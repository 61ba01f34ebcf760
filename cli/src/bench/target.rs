//! One line of the targets table, shared by the scenarios' reports.

/// One line of the target check.
pub struct Target {
    pub name: String,
    pub measured: String,
    pub ratio: Option<f64>,
    pub limit: f64,
    /// `None` when there was nothing to compare.
    pub met: Option<bool>,
}
