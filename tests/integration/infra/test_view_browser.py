"""`stacx view` in a real browser: headless Chromium (Debian's `chromium` and `chromedriver`,
installed by `stacx infra up`) driven by Selenium, against a run whose trajectory and weight
events went through the product's producer to a real broker, with traceparent headers.

The run starts live (a run folder without report, its logs moving): its page refreshes itself and
shows trajectories published after it was opened. Then it finishes (report.json): the browser
opens the run list, the run's curves, filters the trajectories by reward, opens one, and counts the
tokens shown as trained against the trajectory's loss mask. Its screenshots are the ones
docs/observability.md shows (`STACX_SCREENSHOTS_DIR=docs` writes them there).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from ports import free_port
from run_names import run_name

from stacx.infra.pipeline.layout import RunTopics
from stacx.infra.pipeline.report import write_report
from stacx.infra.services.topics import ensure_topics
from stacx.producers import EventProducer
from stacx.rollout.models.tokenizer import make_tokenizer
from stacx.schemas.records import ToolCall, Trajectory, Turn, WeightVersion, logprobs, loss_mask, token_ids

REPO = Path(__file__).resolve().parents[3]
STACX = str(Path(sys.executable).with_name("stacx"))
SCREENSHOTS = Path(os.environ.get("STACX_SCREENSHOTS_DIR") or REPO / "runs" / "screenshots")
"""Where the screenshots go: `STACX_SCREENSHOTS_DIR=docs` refreshes the ones docs/observability.md
shows; by default they land under runs/ (git-ignored), so a test run leaves the checkout as it was."""
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
TRAINER_LOG_LINE = (
    "2026-12-02 01:0{m}:{s:02d},000 INFO rank0 stacx.trainer.engine: step {step} batch b{step:031d} "
    "loss {loss:.5f} tokens {tokens}\n"
)
"""The trainer's line per step, as it writes it to runs/<name>/logs/trainer.log."""


def _episode(tok: Any, *, task: int, sample: int, version: int, reward: float) -> Trajectory:
    """A ReTool-style episode: prompt, tool call, its output, answer (masked as the rollout does)."""
    a, b = 10 + task, 7 + sample
    prompt = tok.encode(f"<|im_start|>user\nWhat is {a}*{b}?<|im_end|>\n<|im_start|>assistant\n")
    call_text = f"<tool_call>print({a}*{b})</tool_call>"
    call = tok.encode(call_text)
    observation = tok.encode(f"\n<tool_response>\n{a * b}\n</tool_response>\n")
    answer_text = f"<answer>{a * b if reward >= 1 else a * b + 1}</answer>"
    answer = tok.encode(answer_text)
    ids = prompt + call + observation + answer
    mask = [0] * len(prompt) + [1] * len(call) + [0] * len(observation) + [1] * len(answer)
    return Trajectory(
        trajectory_id=f"{task:02d}{sample:02d}{version:02d}".ljust(32, "0"),
        group_id=f"g{task}-{version}",
        sample_index=sample,
        task_id=f"arith-{task}",
        task_type="arithmetic",
        model_name="policy",
        policy_version=version,
        turns=[
            Turn(role="user", text=f"What is {a}*{b}?", token_ids=token_ids(prompt)),
            Turn(
                role="assistant",
                text=call_text,
                token_ids=token_ids(call),
                policy_version=version,
                tool_calls=[ToolCall(id="call-1", name="python", arguments=f"print({a}*{b})")],
            ),
            Turn(role="tool", text=str(a * b), token_ids=token_ids(observation), observation=str(a * b)),
            Turn(role="assistant", text=answer_text, token_ids=token_ids(answer), policy_version=version),
        ],
        token_ids=token_ids(ids),
        loss_mask=loss_mask(mask),
        logprobs=logprobs([-0.25 * m for m in mask]),  # sampling logprobs on generated tokens only
        prompt_length=len(prompt),
        rewards={"reward": reward, "answered": 1.0},
        reward=reward,
        metadata={"exit_codes": "0", "num_tool_calls": "1", "num_turns": "2"},
    )


class _Run:
    """A run's topics, folder and events, published like the rollout and the trainer do."""

    def __init__(self, bootstrap: str, root: Path, tokenizer_dir: Path) -> None:
        self.name = run_name("view")
        self.run_id = f"{self.name}-20261202-010000"
        self.topics = RunTopics.for_run(self.run_id, fresh=True)
        ensure_topics(bootstrap, self.topics.specs())
        self.root = root / self.name
        self.tok = make_tokenizer()
        self.tokenizer_dir = tokenizer_dir
        self.published: dict[str, Trajectory] = {}
        self.trace_ids: dict[str, str] = {}
        self.producer = EventProducer(EventProducer.Config(bootstrap_servers=bootstrap, linger_ms=1.0))
        from opentelemetry.sdk.trace import TracerProvider

        self.tracer = TracerProvider().get_tracer("test.view")

    def write_folder(self) -> None:
        (self.root / "config").mkdir(parents=True)
        (self.root / "logs").mkdir()
        rollout = {
            "inference": {"tokenizer": str(self.tokenizer_dir)},
            "kafka": {"trajectories_topic": self.topics.trajectories, "weights_topic": self.topics.weights},
            "manager": {"model_name": "policy"},
        }
        (self.root / "config" / "rollout.yaml").write_text(yaml.safe_dump(rollout))
        lines = [
            TRAINER_LOG_LINE.format(m=1, s=4 * step, step=step, loss=0.5 / step, tokens=900 + 10 * step)
            for step in range(1, 4)
        ]
        (self.root / "logs" / "trainer.log").write_text("".join(lines))
        self.touch()

    def touch(self) -> None:
        with (self.root / "logs" / "pipeline.log").open("a") as log:
            log.write(
                f"{time.strftime('%Y-%m-%d %H:%M:%S')},000 INFO stacx.infra.pipeline.orchestrator: "
                "stage: GRPO through Kafka (target: 3 policy versions) | elapsed: 9 s\n"
            )

    def publish(self, version: int, rewards: list[float], task: int = 0) -> None:
        for sample, reward in enumerate(rewards):
            t = _episode(self.tok, task=task, sample=sample, version=version, reward=reward)
            with self.tracer.start_as_current_span("rollout.episode") as span:
                self.producer.publish(self.topics.trajectories, t).result(timeout=30)
                self.trace_ids[t.trajectory_id] = f"{span.get_span_context().trace_id:032x}"
            self.published[t.trajectory_id] = t
        weights = WeightVersion(model_name="policy", version=version + 1, path="/nowhere", step=version + 1)
        self.producer.publish(self.topics.weights, weights).result(timeout=30)

    def finish(self) -> None:
        report = {
            "name": self.name,
            "status": "ok",
            "error": None,
            "stage": "done",
            "run_id": self.run_id,
            "success_before": 0.25,
            "success_after": 0.75,
            "policy_versions": 3,
            "wall_s": 42.0,
            "heldout_curve": [{"version": 0, "success": 0.25}, {"version": 3, "success": 0.75}],
            "topics": {"trajectories": self.topics.trajectories, "weights": self.topics.weights},
            "model_name": "policy",
        }
        write_report(self.root / "report.json", report)


@pytest.fixture
def browser() -> Iterator[Any]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.fail(
            "chromium and chromedriver are not on PATH; `stacx infra up` installs them "
            "(apt-get install chromium chromium-driver)",
            pytrace=False,
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,1100",
        "--disable-gpu",
        "--no-first-run",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)  # no browser download
    driver.set_page_load_timeout(240)  # the first trajectory page loads the tokenizer: slow on a busy machine
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def view(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = free_port()
    proc = subprocess.Popen(
        [STACX, "view", "--runs-dir", str(tmp_path / "runs"), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/static/view.css", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"stacx view did not start: {proc.communicate()}")
        time.sleep(0.5)
    try:
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _text(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, css).text)


@pytest.mark.timeout(600)
def test_the_browser_shows_runs_curves_and_a_trajectorys_trained_tokens(
    kafka_bootstrap: str, tmp_path: Path, browser: Any, view: tuple[str, subprocess.Popen[str]]
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url, proc = view
    tokenizer_dir = tmp_path / "tokenizer"
    make_tokenizer().save_pretrained(tokenizer_dir)
    run = _Run(kafka_bootstrap, tmp_path / "runs", tokenizer_dir)
    run.write_folder()
    run.publish(0, [0.0, 0.0, 1.0, 0.0], task=1)
    run.publish(1, [1.0, 0.0, 1.0, 0.5], task=2)

    # live: the run list says so, and the run page refreshes itself as events come
    browser.get(url + "/")
    row = browser.find_element(By.CSS_SELECTOR, f'tr.run[data-run-id="{run.run_id}"]')
    assert "running" in row.text
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / "view-runs.png"))
    row.find_element(By.TAG_NAME, "a").click()
    assert _text(browser, "#num-trajectories") == "8"
    assert browser.find_elements(By.ID, "live")
    run.publish(2, [1.0, 1.0, 0.0, 1.0], task=3)
    run.touch()
    WebDriverWait(browser, 60, poll_frequency=1).until(lambda d: _text(d, "#num-trajectories") == "12")

    # finished: the same page without refreshing, with every curve drawn
    run.finish()
    browser.refresh()
    assert "finished" in _text(browser, "#status") and not browser.find_elements(By.ID, "live")
    for chart in ("chart-reward", "chart-staleness", "chart-throughput", "chart-loss", "chart-tokens"):
        points = int(browser.find_element(By.ID, chart).get_attribute("data-points"))
        assert points > 0, chart
    assert int(browser.find_element(By.ID, "chart-reward").get_attribute("data-points")) == 3 * 3 + 2
    assert int(browser.find_element(By.ID, "chart-loss").get_attribute("data-points")) == 3
    versions = [r.text.split()[:2] for r in browser.find_elements(By.CSS_SELECTOR, "#versions tr")[1:]]
    assert versions == [["0", "4"], ["1", "4"], ["2", "4"]]
    browser.save_screenshot(str(SCREENSHOTS / "view-run.png"))

    # the trajectory browser: reward >= 1 only
    browser.find_element(By.ID, "trajectories-link").click()
    browser.find_element(By.ID, "f-min_reward").send_keys("1")
    browser.find_element(By.ID, "apply").click()
    WebDriverWait(browser, 30).until(lambda d: "min_reward=1" in d.current_url)
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.trajectory")
    solved = [t for t in run.published.values() if t.reward >= 1.0]
    assert len(rows) == len(solved) == 6
    assert all(float(r.get_attribute("data-reward")) >= 1.0 for r in rows)
    browser.save_screenshot(str(SCREENSHOTS / "view-trajectories.png"))

    # one trajectory: every token once, the trained ones exactly the loss mask's
    rows[0].find_element(By.TAG_NAME, "a").click()
    trajectory_id = browser.find_element(By.CSS_SELECTOR, "#facts td").text
    published = run.published[trajectory_id]
    trained = browser.find_elements(By.CSS_SELECTOR, ".tokens .tok.trained")
    masked = browser.find_elements(By.CSS_SELECTOR, ".tokens .tok.masked")
    assert len(trained) == int(published.loss_mask.sum()) > 0
    assert len(trained) + len(masked) == len(published.token_ids)
    assert _text(browser, "#num-trained") == str(int(published.loss_mask.sum()))
    shown = "".join(t.text for t in trained)
    assert "<tool_call>" in shown and "<answer>" in shown  # decoded with the run's tokenizer
    assert (
        browser.find_element(By.ID, "trace-link")
        .get_attribute("href")
        .endswith(f"/traces/{run.trace_ids[trajectory_id]}")  # the view's own trace page
    )
    assert "sandbox exit code 0" in browser.find_element(By.CSS_SELECTOR, '.turn[data-turn="2"]').text
    assert "python" in browser.find_element(By.CSS_SELECTOR, '.turn[data-turn="1"]').text
    assert "answered" in _text(browser, "#rewards")
    browser.save_screenshot(str(SCREENSHOTS / "view-trajectory.png"))
    run.producer.close()

    # a clean stop: one line, no traceback, 128 + SIGTERM
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.strip().splitlines() == ["stacx view: stopped by SIGTERM"], err
