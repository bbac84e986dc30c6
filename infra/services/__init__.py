"""Local services started by `stacx infra up`: Kafka (KRaft), the Docker engine, the sandbox image."""
