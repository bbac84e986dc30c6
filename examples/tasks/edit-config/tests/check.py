"""Reward 1 when the three edits are made and nothing else changed."""

import configparser
from pathlib import Path

EXPECTED = {
    "server": {"host": "127.0.0.1", "port": "8080", "workers": "2"},
    "logging": {"level": "DEBUG", "file": "/var/log/service.log"},
    "features": {"beta": "no", "cache": "yes"},
}


def reward() -> float:
    parser = configparser.ConfigParser()
    try:
        if not parser.read("/app/service.ini"):
            return 0.0
    except configparser.Error:
        return 0.0
    actual = {s: dict(parser[s]) for s in parser.sections()}
    return float(actual == EXPECTED)


Path("/logs/verifier").mkdir(parents=True, exist_ok=True)
Path("/logs/verifier/reward.txt").write_text(f"{reward()}\n")
