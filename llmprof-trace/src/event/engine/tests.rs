//! The timeline on transitions and steps built in code: the engine-reported phases, the tiling segments and
//! the token steps of each shape of a request's life.

use super::*;

const MS: u64 = 1_000_000;

fn step(id: u64, kind: StepKind, start: u64, end: u64) -> StepInfo {
    StepInfo {
        step_id: id,
        kind: Some(kind),
        start_ns: start,
        end_ns: end,
        num_seqs: 1,
        prefill_tokens: 0,
        decode_tokens: 0,
        request_tokens: None,
    }
}

fn arrived(ts: u64) -> RequestTimeline {
    let mut t = RequestTimeline::new(1, ts, Transition::Arrived, RequestInfo::default());
    t.transition(Transition::Arrived, ts);
    t
}

#[test]
fn engine_phases_follow_the_transitions() {
    let mut t = arrived(0);
    assert_eq!(t.phase(), Some((Phase::Queued, 0)));
    let c = t.transition(Transition::Scheduled, 2 * MS);
    assert_eq!(
        c,
        PhaseChange {
            closed: Some(Phase::Queued),
            opened: Some(Phase::Prefill)
        }
    );
    t.transition(Transition::FirstToken, 5 * MS);
    t.transition(Transition::Preempted, 7 * MS);
    // Rescheduled after the first token: decode (the sink's phase), a recompute chunk (the tiling).
    let c = t.transition(Transition::Scheduled, 9 * MS);
    assert_eq!(c.opened, Some(Phase::Decode));
    let c = t.transition(Transition::Finished(FinishReason::Stop), 12 * MS);
    assert_eq!((c.closed, c.opened), (Some(Phase::Decode), None));
    assert_eq!(t.queued_before_first_token_ns(), Some(2 * MS));
    assert_eq!(t.prefill_before_first_token_ns(), Some(3 * MS));
    assert_eq!(t.ttft_ns(), Some(5 * MS));
    assert_eq!(t.info().finish_reason, Some(FinishReason::Stop));
}

#[test]
fn segments_tile_and_tokens_come_from_the_steps_after_the_first_token() {
    let mut t = arrived(0);
    t.transition(Transition::Scheduled, MS);
    assert_eq!(t.on_step(&step(1, StepKind::Prefill, MS, 4 * MS)), None);
    t.transition(Transition::FirstToken, 4 * MS);
    assert_eq!(
        t.on_step(&step(2, StepKind::Decode, 5 * MS, 6 * MS)),
        Some(2 * MS)
    );
    assert_eq!(t.on_step(&step(3, StepKind::Mixed, 6 * MS, 9 * MS)), Some(3 * MS));
    // The engine finishes a request before it records the step that produced its last token.
    t.transition(Transition::Finished(FinishReason::Length), 10 * MS);
    assert_eq!(
        t.on_step(&step(4, StepKind::Decode, 9 * MS, 11 * MS)),
        Some(2 * MS)
    );
    assert_eq!(t.steps(), 3, "the step after the finish is not in the segments");
    assert_eq!(t.first_decode_step_ns(), Some(MS));
    assert_eq!(t.token_steps(), 3);
    let kinds: Vec<_> = t.segments().iter().map(|s| s.kind).collect();
    assert!(matches!(
        kinds[..],
        [
            SegmentKind::Queue,
            SegmentKind::Prefill {
                index: 0,
                recompute: false,
                step: Some(_)
            },
            SegmentKind::Decode { steps: 2 }
        ]
    ));
    let s = t.segments();
    assert_eq!((s[0].start, s[2].end), (0, 10 * MS));
    assert!(s.windows(2).all(|w| w[0].end == w[1].start));
}

#[test]
fn a_request_first_seen_mid_way_starts_in_the_phase_it_shows() {
    let mut t = RequestTimeline::new(9, 3 * MS, Transition::FirstToken, RequestInfo::default());
    t.transition(Transition::FirstToken, 3 * MS);
    assert!(t.attached_mid_request());
    assert_eq!(t.ttft_ns(), Some(0));
    assert_eq!(t.phase(), Some((Phase::Decode, 3 * MS)));
    let (end, closed) = t.close_unfinished(8 * MS);
    assert_eq!((end, closed), (8 * MS, Some(Phase::Decode)));
    assert_eq!(t.finished_ns(), None);
    assert!(matches!(
        t.segments(),
        [Segment {
            kind: SegmentKind::Decode { steps: 0 },
            ..
        }]
    ));
}
