//! The goals a row's figure is judged against.

/// What a row's figure should be, checked against the measured value.
#[derive(Clone, Copy, Debug)]
pub enum Goal {
    /// A figure reported, nothing to meet.
    None,
    AtLeast(f64),
    AtMost(f64),
    Above(f64),
    Exactly(f64),
    /// At least `min`, if any, and at most `within` below the reference's
    /// ratio (above it is fine).
    NearReference {
        min: Option<f64>,
        within: f64,
    },
}

impl Goal {
    /// The goal as the table says it, `unit` after the figure.
    pub fn text(self, unit: &str) -> String {
        // 0.5 and 15, not 0.50 and 15.00; 0.23 for 0.25 - 0.02.
        let n = |v: f64| {
            let s = format!("{v:.2}");
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        };
        match self {
            Goal::None => "-".to_owned(),
            Goal::AtLeast(v) => format!(">= {}{unit}", n(v)),
            Goal::AtMost(v) => format!("<= {}{unit}", n(v)),
            Goal::Above(v) => format!("> {}{unit}", n(v)),
            Goal::Exactly(v) => format!("{}{unit}", n(v)),
            Goal::NearReference { min, within } => {
                let near = format!(">= reference - {}", n(within));
                min.map_or(near.clone(), |min| format!(">= {} and {near}", n(min)))
            }
        }
    }

    /// Whether `value` meets the goal; `None` when there is nothing to
    /// meet or the reference it needs was not measured.
    pub fn met(self, value: f64, reference: Option<f64>) -> Option<bool> {
        match self {
            Goal::None => None,
            Goal::AtLeast(v) => Some(value >= v),
            Goal::AtMost(v) => Some(value <= v),
            Goal::Above(v) => Some(value > v),
            Goal::Exactly(v) => Some(value == v),
            Goal::NearReference { min, within } => {
                if min.is_some_and(|min| value < min) {
                    return Some(false);
                }
                reference.map(|r| value >= r - within)
            }
        }
    }
}

/// The goals that differ between the backends.
pub struct Goals {
    /// B1, record mode, bare INSERT.
    pub record: Goal,
    /// B1, transactional mode, bare INSERT.
    pub tx: Goal,
    /// B2.
    pub replay: Goal,
    /// B4', waiter p99 in ms.
    pub processes: Goal,
}
