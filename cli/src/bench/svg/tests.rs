use super::*;

#[test]
fn renders_series_and_skips_what_log_axes_cannot_show() {
    let chart = Chart {
        title: "a < b".into(),
        x_label: "ranks".into(),
        y_label: "us".into(),
        series: vec![
            Series {
                name: "ours".into(),
                points: vec![(2.0, 10.0), (4.0, 100.0), (8.0, 0.0)],
                dashed: false,
                color: None,
            },
            Series {
                name: "seed".into(),
                points: vec![(2.0, 1000.0)],
                dashed: true,
                color: Some(0),
            },
        ],
    };
    let svg = chart.render();
    assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
    assert!(svg.contains("a &lt; b"));
    assert_eq!(svg.matches("<polyline").count(), 2);
    assert_eq!(svg.matches("<circle").count(), 3);
    assert!(svg.contains("stroke-dasharray"));
    let empty = Chart {
        series: vec![],
        ..chart
    };
    assert!(empty.render().contains("no data"));
}
