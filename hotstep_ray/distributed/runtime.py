"""Start or join Ray with the settings every entry point wants."""

from __future__ import annotations

import logging
import os

from hotstep_ray.core.compile_cache import compile_cache_vars
from hotstep_ray.distributed.gpu_share import local_ray_resources

# Ray reads these at import/init time: no usage stats from our machines, and no token-auth surprise
# when a driver joins a `ray start` head (Ray 2.60 enables token auth by default).
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray Train's controller polls its workers every 2 s by default, and a run's start, each report
# and its end wait for the next poll: seconds per run and per checkpoint. Polled every 0.5 s,
# they wait a quarter as long, for a cheap status call per worker. Inherited by a local Ray's
# processes; `cluster/start-node.py` gives a cluster's nodes the same value.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")


def ensure_ray(address: str | None = None, num_cpus: int | None = None, quiet: bool = True):
    """Connect to `address` (e.g. "auto", "ray://head:10001"), or start a local Ray if none is
    given and none is running. Returns the `ray` module. Safe to call twice."""
    import ray

    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS") or None
    kwargs: dict = {
        "ignore_reinit_error": True,
        "logging_level": logging.WARNING if quiet else logging.INFO,
        "log_to_driver": not quiet,
    }
    cache_vars = compile_cache_vars()
    if cache_vars:  # every worker of this job compiles into (and loads from) the same cache
        kwargs["runtime_env"] = {"env_vars": cache_vars}
    if address:
        ray.init(address=address, **kwargs)
    else:
        # "local" always starts a fresh instance: without it, ray.init() silently joins any
        # `ray start` head left running on this machine, with that cluster's resources.
        # A GPU machine's memory as `VRAM_GB`, as `cluster/start-node.py` declares it on a cluster:
        # the trainers then ask for shares of a card and can train side by side.
        ray.init(
            address="local",
            num_cpus=num_cpus,
            resources=local_ray_resources() or None,
            include_dashboard=False,
            **kwargs,
        )
    return ray


def one_machine() -> bool:
    """Whether the connected Ray is this machine alone (a local Ray, or a one-node head here)."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    alive = [node["NodeID"] for node in ray.nodes() if node.get("Alive")]
    return alive == [here]


def shutdown_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


def die_after_checkpoint(fail_at_step: int | None, step: int) -> None:
    """Fault injection for the Ray Train resume tests (a job's `fail_at_step`): once `step`
    reaches it, wait until Ray has registered the checkpoint just reported, then end the worker
    process hard (exit 17, no cleanup), as a lost node would."""
    if fail_at_step is None or step < fail_at_step:
        return
    import ray.train

    ray.train.get_all_reported_checkpoints(timeout_s=60)
    os._exit(17)


def remove_orphaned_placement_groups() -> list[str]:
    """Remove the placement groups an actor created and died holding; their ids (hex).

    Ray frees a group that is not detached only once its creator actor AND its creator job are
    dead. A Ray Train job started by a studio job runner leaves one behind when the runner is
    killed (cancel): the Train controller that created the group dies with the runner, but the
    job (the studio server's driver) lives on, and Ray Train's own cleaner asks the State API,
    which needs the dashboard the studio's local Ray starts without. The group then holds its CPU
    (a GPU on a GPU box) and later jobs queue behind it forever. Reads the GCS's placement-group
    table (Ray's private state accessor, as `ray.util.placement_group_table` does) for the
    creator fields that function leaves out; returns [] where that accessor is unavailable."""
    import ray
    from ray.util import placement_group_table, remove_placement_group
    from ray.util.placement_group import PlacementGroup

    try:
        from ray._private.state import state
        from ray.core.generated import gcs_pb2

        table = state._connect_and_get_accessor().get_placement_group_table()
    except Exception:  # another Ray version's internals: nothing to free by this rule
        logging.getLogger(__name__).debug("placement-group table unavailable", exc_info=True)
        return []
    nil = ray.ActorID.nil().binary()
    removed = []
    for raw in table:
        data = gcs_pb2.PlacementGroupTableData.FromString(raw)
        created_by_actor = data.creator_actor_id and data.creator_actor_id != nil
        alive = data.state != gcs_pb2.PlacementGroupTableData.REMOVED
        if alive and created_by_actor and data.creator_actor_dead and not data.is_detached:
            group = PlacementGroup(ray.PlacementGroupID(data.placement_group_id))
            remove_placement_group(group)
            removed.append(group.id.hex())
    if removed:
        placement_group_table()  # a round trip to the GCS: the removals have been applied
    return removed


def worker_up_line(submitted_at: float) -> str:
    """How long a Ray Train worker took to come up since its job was submitted (unix s), split at
    its process's start: before it, Ray placing the job (controller, placement group, worker
    actors); after it, the worker importing the train function's modules and joining its group."""
    import time

    import psutil  # a Ray dependency

    now, born = time.time(), psutil.Process().create_time()
    waited, placed = now - submitted_at, born - submitted_at
    return (
        f"Ray Train worker up {waited:.1f} s after the job was submitted: its process started "
        f"at {placed:.1f} s, then {waited - placed:.1f} s of imports and joining its group"
    )
