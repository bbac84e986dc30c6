"""`stacx view`: a local web app of runs, their curves and their trajectories (read from the
run folders and the runs' Kafka topics)."""

from stacx.infra.view.app import ViewConfig, create_app

__all__ = ["ViewConfig", "create_app"]
