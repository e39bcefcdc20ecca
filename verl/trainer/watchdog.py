"""The training-health watchdog: rules over each step's metrics that warn, stop the run, or roll it back.

A rule watches one metric and trips on each step its value is below a floor (`below`), above a ceiling
(`above`) or not finite (`nonfinite`); it fires when it has tripped `steps` steps in a row, and again every
`steps` steps while it keeps tripping. A step that does not log the metric (no actor update: no entropy)
neither trips a rule nor ends its streak. What a firing does is the rule's `action`, or the watchdog's:
- warn: a console line, a row in `<run_dir>/watchdog.jsonl`, and `watchdog/*` metrics for that step;
- stop: the same, then a report (`<run_dir>/watchdog_report.md`) and the run ends (`WatchdogStop`);
- rollback: the same, then the trainer reloads the newest checkpoint saved while no rule was tripping and
  continues from it with other training seeds (fresh start states and samples), at most `max_rollbacks` times.
`watchdog.jsonl` is what `python -m ragen.plot` marks on every panel.
"""

import difflib
import math
from dataclasses import dataclass
from pathlib import Path

from verl.trainer.config import WatchdogConfig, WatchdogRule
from verl.utils.tracking import ROLLED_BACK_FILE, read_jsonl, to_json, write_jsonl

ACTIONS = ("off", "warn", "stop", "rollback")  # in order of severity
CONDITIONS = ("below", "above", "nonfinite")
EVENTS_FILE = "watchdog.jsonl"
REPORT_FILE = "watchdog_report.md"
# a rollback shifts the training seeds by this much per rollback: far past any run's own seeds (seed + step x
# env_groups) and the validation seeds (trainer.val_seed + group), and within numpy's 32-bit seeds for 40 rollbacks
ROLLBACK_SEED_STRIDE = 100_000_007
UNSEEN_CHECK_STEPS = 3  # after this many steps, say which rules watch a metric no step has logged (a typo?)


class WatchdogStop(RuntimeError):
    """A rule whose action is `stop` fired (or a rollback had nowhere to go); the message names the report."""


@dataclass
class Event:
    step: int
    attempt: int  # rollbacks before it: the steps after a rollback are played again, on other seeds
    rule: str
    action: str
    metric: str
    value: float | None
    message: str


def trips(rule: WatchdogRule, value: float) -> bool:
    if rule.condition == "nonfinite":
        return not math.isfinite(value)
    if not math.isfinite(value):  # a NaN entropy is not "below the floor": the nonfinite rules see it
        return False
    return value < rule.threshold if rule.condition == "below" else value > rule.threshold


def describe(rule: WatchdogRule) -> str:
    if rule.condition == "nonfinite":
        return f"{rule.metric} not finite"
    return f"{rule.metric} {'<' if rule.condition == 'below' else '>'} {rule.threshold:g}"


class Watchdog:
    def __init__(self, config: WatchdogConfig, run_dir: str | Path):
        self.config = config
        self.rules = {name: rule for name, rule in config.rules.items() if self.action_of(rule) != "off"}
        self.streaks = {name: 0 for name in self.rules}
        self.history: list[dict[str, float]] = []  # the watched metrics of the steps seen, for the report
        self.attempt = 0  # rollbacks so far (`reset`)
        self.seen: set[str] = set()  # every metric key logged so far
        self.events_path = Path(run_dir) / EVENTS_FILE
        self.report_path = Path(run_dir) / REPORT_FILE

    def action_of(self, rule: WatchdogRule) -> str:
        return rule.action or self.config.action

    def observe(self, step: int, metrics: dict[str, float]) -> list[Event]:
        """Update every rule's streak with this step's metrics; return the events that fired (also written
        to watchdog.jsonl)."""
        self.history.append({"step": step, "attempt": self.attempt} | {
            r.metric: metrics[r.metric] for r in self.rules.values() if r.metric in metrics})
        self.seen |= metrics.keys()
        if len(self.history) == UNSEEN_CHECK_STEPS:
            self.warn_unseen()
        events = []
        for name, rule in self.rules.items():
            if rule.metric not in metrics:
                continue
            value = float(metrics[rule.metric])
            self.streaks[name] = self.streaks[name] + 1 if trips(rule, value) else 0
            if self.streaks[name] and self.streaks[name] % rule.steps == 0:
                action = self.action_of(rule)
                message = (f"{describe(rule)} for {self.streaks[name]} step(s) in a row (now {value:.4g})")
                events.append(Event(step, self.attempt, name, action, rule.metric,
                                    value if math.isfinite(value) else None, message))
        if events:
            with self.events_path.open("a", encoding="utf-8") as f:
                f.writelines(to_json(vars(event)) + "\n" for event in events)
        return events

    def warn_unseen(self) -> None:
        """A rule whose metric no step has logged may have a misspelt name: it would never fire."""
        for name, rule in self.rules.items():
            if rule.metric not in self.seen:
                close = difflib.get_close_matches(rule.metric, self.seen, n=2)
                print(f"[watchdog] rule {name} watches {rule.metric!r}, which none of the first {UNSEEN_CHECK_STEPS} "
                      f"steps logged" + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else "")
                      + f": check trainer.watchdog.rules.{name}.metric", flush=True)

    @staticmethod
    def announce(events: list[Event]) -> None:
        """One console line per event (after the step's own line)."""
        for event in events:
            print(f"[watchdog] step {event.step}: {event.rule}: {event.message} -> {event.action}", flush=True)

    def start(self) -> None:
        """A fresh run: an earlier run's events in the same folder are not ours."""
        self.events_path.unlink(missing_ok=True)
        self.report_path.unlink(missing_ok=True)
        (self.events_path.parent / ROLLED_BACK_FILE).unlink(missing_ok=True)

    def restore(self, streaks: dict[str, int]) -> None:
        """Resume the streaks a checkpoint saved (`streaks`), of the rules this run still has: a resumed
        run fires where the uninterrupted one would have."""
        self.streaks |= {name: count for name, count in streaks.items() if name in self.streaks}

    def healthy(self) -> bool:
        """Whether no rule that stops or rolls back is tripping now: a checkpoint saved now is one a rollback
        may return to (and checkpoint pruning keeps it until a newer one is healthy)."""
        return not any(count for name, count in self.streaks.items()
                       if self.action_of(self.rules[name]) in ("stop", "rollback"))

    def truncate(self, after_step: int) -> None:
        """A resume from the checkpoint of `after_step`: the events of this attempt after it are logged again."""
        if self.events_path.is_file():
            kept = [e for e in read_jsonl(self.events_path) if e["attempt"] < self.attempt or e["step"] <= after_step]
            write_jsonl(self.events_path, kept)

    def reset(self, attempt: int) -> None:
        """After a rollback: forget the streaks (the steps they counted are undone); `attempt` rollbacks so far."""
        self.streaks = dict.fromkeys(self.streaks, 0)
        self.attempt = attempt

    def metrics(self, events: list[Event]) -> dict[str, float]:
        """`watchdog/fired` (how many rules fired this step) and `watchdog/<rule>` per rule that fired."""
        return {"watchdog/fired": float(len(events))} | {f"watchdog/{e.rule}": 1.0 for e in events}

    @staticmethod
    def decision(events: list[Event]) -> str:
        """The most severe action among the events: stop > rollback > warn (a stop is never overruled)."""
        actions = {e.action for e in events}
        return next((a for a in ("stop", "rollback", "warn") if a in actions), "none")

    def write_report(self, events: list[Event], reason: str, healthy_checkpoint: Path | None) -> Path:
        """A Markdown report of why the run stopped: the rules that fired, the watched metrics of the last
        steps (`try`: rollbacks before the step), and the newest checkpoint saved while no rule tripped."""
        metrics = sorted({r.metric for r in self.rules.values()})
        lines = [f"# The watchdog stopped this run at step {events[0].step}", "", reason, "",
                 "## Rules that fired", ""]
        lines += [f"- `{e.rule}`: {e.message} (action: {e.action})" for e in events]
        lines += ["", "## Watched metrics, last steps", "", "| step | try | " + " | ".join(metrics) + " |",
                  "|---" * (len(metrics) + 2) + "|"]
        for row in self.history[-12:]:
            cells = [f"{row[m]:.4g}" if m in row else "" for m in metrics]
            lines.append(f"| {row['step']} | {row['attempt']} | " + " | ".join(cells) + " |")
        lines += ["", "## Next", ""]
        lines.append(f"The newest checkpoint saved while no rule was tripping is {healthy_checkpoint}: "
                     f"`trainer.resume_mode={healthy_checkpoint}` continues from it, e.g. with a lower learning rate."
                     if healthy_checkpoint else "No checkpoint was saved while no rule was tripping.")
        lines.append("The rules and their thresholds are `trainer.watchdog.rules.<name>.*` (docs/reading-a-run.md, "
                     "'Training health').")
        self.report_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return self.report_path


def read_events(run_dir: str | Path) -> list[dict]:
    """The events of a run (none when it had no watchdog or nothing fired)."""
    path = Path(run_dir) / EVENTS_FILE
    return read_jsonl(path) if path.is_file() else []
