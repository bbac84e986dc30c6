"""`stacx view` without services: run discovery, curves, token spans and the rendered pages."""

from __future__ import annotations

import calendar
import dataclasses
import json
import os
import re
import time
from pathlib import Path

import yaml

from stacx.infra.commands.quickstart import _print_summary
from stacx.infra.view.chart import Line, line_chart
from stacx.infra.view.curves import per_version, read_trainer_steps, staleness_of, throughput, tokens_per_s
from stacx.infra.view.pages import TrajectoryFilter, run_page, trajectories_page, trajectory_page
from stacx.infra.view.reader import Fetched, TrajectorySummary, VersionPoint, trace_id_of
from stacx.infra.view.runs import RunStatus, merge_runs, read_run_dir, runs_on_broker
from stacx.infra.view.tokens import turn_spans
from stacx.schemas.records import ToolCall, Trajectory, Turn, loss_mask, token_ids

TRAINER_LOG = (
    "2026-12-02 00:34:57,605 INFO rank0 stacx.trainer.engine: step 1 batch b7632525685ac31a27610ad6d87734fb "
    "loss 0.25000 tokens 956\n"
    "2026-12-02 00:34:58,926 INFO rank0 stacx.trainer.engine: resumed at step 1, positions {}\n"
    "2026-12-02 00:34:59,605 INFO rank0 stacx.trainer.engine: step 2 batch 11ae8e63bdb2d59b3ef4b7ef61a61817 "
    "loss -0.12500 tokens 768\n"
)
"""Lines as the trainer writes them to runs/<name>/logs/trainer.log."""


def _summary(version: int, reward: float, at_ms: int, **kw: object) -> TrajectorySummary:
    fields: dict[str, object] = dict(
        partition=0,
        offset=at_ms,
        timestamp_ms=at_ms,
        trajectory_id=f"t{at_ms}",
        task_id="task-1",
        task_type="math",
        model_name="policy",
        policy_version=version,
        reward=reward,
        status="COMPLETED",
        num_tokens=10,
        num_trained=4,
        num_turns=3,
        num_tool_calls=1,
        trace_id="",
    )
    fields.update(kw)
    return TrajectorySummary(**fields)  # type: ignore[arg-type]


def _trajectory() -> Trajectory:
    prompt, gen1, obs, gen2 = [1, 2, 3], [10, 11], [20, 21, 22], [12, 13, 14]
    template = [99]  # a chat-template token between the observation and the next turn
    ids = prompt + gen1 + obs + template + gen2
    mask = [0] * 3 + [1] * 2 + [0] * 3 + [0] + [1] * 3
    return Trajectory(
        trajectory_id="a" * 32,
        group_id="g",
        sample_index=0,
        task_id="task-<1>",
        task_type="math",
        model_name="policy",
        policy_version=2,
        turns=[
            Turn(role="user", text="What is <b>6*7</b>?", token_ids=token_ids(prompt)),
            Turn(
                role="assistant",
                text="call",
                token_ids=token_ids(gen1),
                tool_calls=[ToolCall(id="c1", name="python", arguments='{"code": "print(6*7)"}')],
            ),
            Turn(role="tool", text="42", token_ids=token_ids(obs), observation="42"),
            Turn(role="assistant", text="<answer>42</answer>", token_ids=token_ids(gen2)),
        ],
        token_ids=token_ids(ids),
        loss_mask=loss_mask(mask),
        rewards={"reward": 1.0, "answered": 1.0},
        reward=1.0,
        metadata={"exit_codes": "3"},
    )


# ------------------------------------------------------------------------------------- runs


def _write_run(root: Path, run_id: str, *, report: bool) -> None:
    (root / "config").mkdir(parents=True)
    (root / "logs").mkdir()
    rollout = {
        "kafka": {
            "trajectories_topic": f"stacx.trajectories.{run_id}",
            "weights_topic": f"stacx.weights.{run_id}",
        },
        "manager": {"model_name": "policy"},
    }
    (root / "config" / "rollout.yaml").write_text(yaml.safe_dump(rollout))
    (root / "logs" / "pipeline.log").write_text("started\n")
    if report:
        (root / "report.json").write_text(
            json.dumps({"run_id": run_id, "status": "ok", "policy_versions": 3})
        )


def test_a_run_folder_with_its_report_is_finished_and_names_its_topics(tmp_path: Path) -> None:
    _write_run(tmp_path / "quickstart", "quickstart-20261202-010000", report=True)
    run = read_run_dir(tmp_path / "quickstart")
    assert run is not None
    assert (run.run_id, run.status) == ("quickstart-20261202-010000", RunStatus.FINISHED)
    assert run.trajectories_topic == "stacx.trajectories.quickstart-20261202-010000"
    assert run.weights_topic == "stacx.weights.quickstart-20261202-010000"
    assert run.model_name is None  # its own topics: every event is the run's


def test_a_run_without_report_is_running_while_its_logs_move_then_stopped(tmp_path: Path) -> None:
    root = tmp_path / "r"
    _write_run(root, "r-20261202-010000", report=False)
    running = read_run_dir(root)
    assert running is not None and running.status == RunStatus.RUNNING and running.live
    old = time.time() - 3600
    os.utime(root / "logs" / "pipeline.log", (old, old))
    stopped = read_run_dir(root)
    assert stopped is not None and stopped.status == RunStatus.STOPPED and not stopped.live


def test_a_rerun_under_the_same_name_is_the_new_run_not_the_old_report(tmp_path: Path) -> None:
    root = tmp_path / "q"
    _write_run(root, "q-20261202-020000", report=False)
    (root / "report.json").write_text(json.dumps({"run_id": "q-20261202-010000", "status": "ok"}))
    run = read_run_dir(root)
    assert run is not None and run.run_id == "q-20261202-020000" and run.report is None


def test_broker_topics_add_the_runs_without_a_folder() -> None:
    names = [
        "stacx.trajectories",
        "stacx.trajectories.a-1",
        "stacx.weights.a-1",
        "stacx.trajectories.b-2",
        "stacx.tasks.c-3",
    ]
    on_broker = runs_on_broker(names)
    assert [(r.run_id, r.weights_topic, r.status) for r in on_broker] == [
        ("a-1", "stacx.weights.a-1", RunStatus.TOPICS_ONLY),
        ("b-2", None, RunStatus.TOPICS_ONLY),
    ]
    folder = runs_on_broker(["stacx.trajectories.a-1"])[0]
    folder.status = RunStatus.FINISHED
    assert [(r.run_id, r.status) for r in merge_runs([folder], on_broker)] == [
        ("a-1", RunStatus.FINISHED),
        ("b-2", RunStatus.TOPICS_ONLY),
    ]


# ----------------------------------------------------------------------------------- curves


def test_staleness_counts_the_versions_published_before_a_trajectory_was_written() -> None:
    summaries = [
        _summary(0, 0.0, 1000),
        _summary(0, 1.0, 3000),
        _summary(1, 1.0, 3500),
        _summary(0, 0.0, 5000),
    ]
    versions = [VersionPoint(version=1, timestamp_ms=2000), VersionPoint(version=2, timestamp_ms=4000)]
    assert staleness_of(summaries, versions) == [0, 1, 0, 2]
    rows = per_version(summaries, versions)
    assert [(r.version, r.episodes) for r in rows] == [(0, 3), (1, 1)]
    assert rows[0].mean_reward == 1 / 3 and rows[0].success == 1 / 3 and rows[0].mean_staleness == 1.0
    assert rows[0].tool_rate == 1.0


def test_throughput_is_trajectories_per_second_per_window() -> None:
    summaries = [_summary(0, 0.0, t) for t in (0, 1000, 2000, 65_000)]
    assert throughput(summaries, bucket_s=30.0) == [(0.0, 3 / 30), (30.0, 0.0), (60.0, 1 / 30)]


def test_the_trainer_log_gives_the_loss_and_tokens_per_step(tmp_path: Path) -> None:
    (tmp_path / "trainer.log").write_text(TRAINER_LOG)
    steps = read_trainer_steps(tmp_path)
    assert [(s.step, s.loss, s.num_tokens, s.sft) for s in steps] == [
        (1, 0.25, 956, False),
        (2, -0.125, 768, False),
    ]
    assert tokens_per_s(steps) == [(2, 384.0)]  # 768 tokens in the 2.0 s since the step before


# ------------------------------------------------------------------------------ trajectories


def test_turn_spans_cover_every_token_once_in_order() -> None:
    t = _trajectory()
    spans = turn_spans(t)
    assert [(s.start, s.end, s.turn) for s in spans] == [
        (0, 3, 0),
        (3, 5, 1),
        (5, 8, 2),
        (8, 9, None),
        (9, 12, 3),
    ]


def test_the_trajectory_page_shows_each_token_once_coloured_by_its_loss_mask() -> None:
    t = _trajectory()
    fetched = Fetched(t, {"traceparent": b"00-" + b"ab" * 16 + b"-" + b"cd" * 8 + b"-01"}, 1, 7)
    html = trajectory_page(_run(), fetched, decode=None)
    assert len(re.findall(r'class="tok trained"', html)) == int(t.loss_mask.sum()) == 5
    assert len(re.findall(r'class="tok masked"', html)) == len(t.token_ids) - 5
    assert 'href="/traces/' + "ab" * 16 + '"' in html  # the view's own trace page, not Jaeger's
    assert "<b>6*7</b>" not in html and "&lt;b&gt;6*7&lt;/b&gt;" in html  # the run's text is escaped
    assert re.search(r'sandbox exit code <span class="exit-fail">3</span>', html)
    assert "python" in html and "answered" in html


def test_the_browser_filters_by_reward_version_and_task() -> None:
    summaries = [_summary(0, 0.0, 1), _summary(1, 1.0, 2), _summary(1, 0.5, 3, task_id="other")]
    html = trajectories_page(_run(), summaries, TrajectoryFilter(min_reward=0.5, version=1))
    assert len(re.findall(r'<tr class="trajectory"', html)) == 2
    html = trajectories_page(_run(), summaries, TrajectoryFilter(task="oth"))
    assert re.findall(r'data-reward="([^"]+)"', html) == ["0.5"]


def test_trace_ids_come_from_the_traceparent_header() -> None:
    assert trace_id_of({"traceparent": b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"}) == "1" * 32
    assert trace_id_of({}) == "" and trace_id_of({"traceparent": b"garbage"}) == ""


def _run():  # type: ignore[no-untyped-def]
    return runs_on_broker(["stacx.trajectories.r-1"])[0]


def test_the_quickstart_ends_with_the_stacx_view_command(capsys) -> None:  # type: ignore[no-untyped-def]
    _print_summary({"curve_png": "runs/quickstart/reward_curve.png", "run_id": "quickstart-20261202-010000"})
    last = capsys.readouterr().out.splitlines()[-1]
    assert "stacx view --runs-dir runs" in last and "/runs/quickstart-20261202-010000" in last


def test_throughput_windows_follow_the_length_of_the_run() -> None:
    hour = [_summary(0, 0.0, t * 1000) for t in range(0, 3600, 10)]
    assert len(throughput(hour)) == 40 and throughput(hour)[1] == (90.0, 9 / 90)  # 90 s windows
    assert throughput([_summary(0, 0.0, 0), _summary(0, 0.0, 2000)]) == [(0.0, 2 / 5)]


def test_a_warming_up_run_is_listed_and_takes_the_topics_its_pipeline_made(tmp_path: Path) -> None:
    root = tmp_path / "quickstart"
    (root / "config").mkdir(parents=True)
    (root / "logs").mkdir()
    (root / "logs" / "pipeline.log").write_text("step 1 batch sft-00000 loss 5.5 tokens 5432\n")
    made = calendar.timegm(time.strptime("20261202-010000", "%Y%m%d-%H%M%S")) + 1
    os.utime(root / "config", (made, made))
    folder = read_run_dir(root, now=made + 10)
    assert folder is not None and folder.trajectories_topic == "" and folder.status == RunStatus.RUNNING
    on_broker = runs_on_broker(
        [
            "stacx.trajectories.quickstart-20261201-090000",
            "stacx.trajectories.quickstart-20261202-010000",
            "stacx.trajectories.other-20261202-010000",
        ]
    )
    merged = merge_runs([folder], on_broker)
    assert [(r.run_id, r.root is not None) for r in merged] == [
        ("quickstart-20261202-010000", True),  # this run's topics: made with its folder
        ("quickstart-20261201-090000", False),  # an earlier run under the same name
        ("other-20261202-010000", False),
    ]
    assert merged[0].trajectories_topic == "stacx.trajectories.quickstart-20261202-010000"


def test_a_port_in_use_is_one_line_and_exit_status_2(capsys) -> None:  # type: ignore[no-untyped-def]
    import socket

    from stacx.infra.cli import build_parser

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        args = build_parser().parse_args(["view", "--port", str(port), "--runs-dir", "runs"])
        assert args.func(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"stacx view: cannot listen on 127.0.0.1:{port} (Address already in use); pass another --port"
    ]


def test_view_reads_its_section_from_a_file_and_flags_override_it(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from stacx.infra.cli import build_parser
    from stacx.infra.commands.view import build_config

    monkeypatch.delenv("STACX_KAFKA", raising=False)
    config = tmp_path / "view.yaml"
    config.write_text(
        "bootstrap_servers: 127.0.0.1:19092\n"
        "view: {runs_dir: /data/runs, port: 8800, jaeger_url: 'http://127.0.0.1:1666'}\n"
    )
    from_file = build_config(build_parser().parse_args(["view", "--config", str(config)]))
    assert (str(from_file.runs_dir), from_file.port, from_file.host) == ("/data/runs", 8800, "127.0.0.1")
    assert from_file.bootstrap_servers == "127.0.0.1:19092"
    assert from_file.jaeger_url == "http://127.0.0.1:1666"
    overridden = build_config(build_parser().parse_args(["view", "--config", str(config), "--port", "8900"]))
    assert overridden.port == 8900 and str(overridden.runs_dir) == "/data/runs"


def test_a_bad_view_section_is_one_line_per_field_and_exit_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from stacx.infra.cli import build_parser

    config = tmp_path / "view.yaml"
    for section, problem in [
        ("{broker_timeout_s: soon}", "view.broker_timeout_s: expected a valid number, got 'soon'"),
        ("{port: 70000}", "port 70000 is not a port (1-65535)"),
    ]:
        config.write_text(f"view: {section}\n")
        args = build_parser().parse_args(["view", "--config", str(config)])
        assert args.func(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"stacx view: {config}: view") and problem in err[0], err


def test_the_list_is_newest_first_by_event_time_whatever_order_the_partitions_were_read() -> None:
    # read cold: partition 1 (older events) drained after partition 0 (newer ones)
    summaries = [_summary(2, 1.0, 5000 + i, partition=0, offset=i) for i in range(3)]
    summaries += [_summary(1, 1.0, 1000 + i, partition=1, offset=i) for i in range(3)]
    html = trajectories_page(_run(), summaries, TrajectoryFilter(limit=2))
    assert re.findall(r'data-version="(\d)"', html) == ["2", "2"]
    assert re.findall(r"/trajectories/(\d/\d)", html) == ["0/2", "0/1"]


def test_pages_go_past_the_first_and_keep_the_filter() -> None:
    summaries = [_summary(1, 1.0, t) for t in range(12000)]
    f = TrajectoryFilter(min_reward=1.0, limit=5000, start=10000)
    html = trajectories_page(_run(), summaries, f)
    assert len(re.findall(r'<tr class="trajectory"', html)) == 2000
    assert "10001 to 12000 shown" in html
    assert 'id="newer" href="/runs/r-1/trajectories?min_reward=1.0&amp;limit=5000&amp;start=5000"' in html
    assert 'id="older"' not in html  # the last page


def test_the_list_never_reloads_itself_so_a_filter_being_typed_stays() -> None:
    live = dataclasses.replace(_run(), status=RunStatus.RUNNING)
    assert live.live
    html = trajectories_page(live, [_summary(1, 1.0, 1)], TrajectoryFilter(task="arith"))
    assert 'http-equiv="refresh"' not in html
    assert 'id="reload" href="/runs/r-1/trajectories?task=arith&amp;limit=200&amp;start=0"' in html


def test_the_warm_start_curve_comes_from_the_report_when_the_logs_have_none() -> None:
    report = {"sft_loss": [[1, 2.5], [2, 1.75], ["x", None]]}
    html = run_page(
        dataclasses.replace(_run(), report=report), summaries=[], rows=[], steps=[], newest_version=None,
        stage=None, reader_error=None, undecodable=0,
    )
    assert re.search(r'id="chart-loss" data-points="2"', html)


def test_charts_are_matplotlib_svg_with_wide_labels_kept_whole() -> None:
    html = line_chart("loss", [Line("loss", [(1, 4350.0), (2, 4352.5)])], x_label="step", y_label="loss",
                      chart_id="c")
    assert html.startswith('<figure class="chart" id="c" data-points="2"')
    assert "<svg" in html and "Matplotlib" in html
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", html)
    assert any(label.startswith("4") and len(label) >= 4 for label in labels), labels  # e.g. 4350.5
