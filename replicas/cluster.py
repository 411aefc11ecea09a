"""Starting (or joining) a Ray cluster and deploying the engine replicas on Ray Serve.

Ray does the distributed work: processes on every node, restarts of dead replicas (Serve's
controller), health checks, the handle's routing. We only say what to deploy.
"""

import logging

import ray
from ray import serve
from ray.serve.config import ProxyLocation, RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from engine.engine_config import EngineConfig
from replicas.engine_deployment import EngineReplica
from replicas.ray_router import PrefixCacheRequestRouter

APP_NAME = "radixserve"
DEPLOYMENT_NAME = "radixserve-engine"
DEFAULT_OBJECT_STORE_BYTES = 500 * 10**6  # only token ids and small replies travel: keep Ray's store small
ROUTING_STATS_PERIOD_S = 1.0  # how often replicas report their page hashes and stats to the router
HEALTH_CHECK_PERIOD_S = 2.0
ROUTERS = ("prefix", "pow2")  # ours, or Ray Serve's default power-of-two-choices


def start_ray(address: str | None, num_cpus: int, object_store_bytes: int = DEFAULT_OBJECT_STORE_BYTES) -> None:
    """Join the cluster at `address` ('auto': the one `ray start` runs here), else start a local one."""
    if address:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    else:
        ray.init(num_cpus=num_cpus, object_store_memory=object_store_bytes, include_dashboard=False,
                 log_to_driver=False, logging_level=logging.WARNING)


def deploy_replicas(engine_config: EngineConfig, num_replicas: int, threads_per_replica: int,
                    router: str = "prefix") -> DeploymentHandle:
    """N EngineReplica actors, `threads_per_replica` CPUs each; returns the handle (routing happens in
    the process that holds it). Blocks until every replica has loaded its model."""
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
    router_config = RequestRouterConfig(request_routing_stats_period_s=ROUTING_STATS_PERIOD_S,
                                        request_routing_stats_timeout_s=10 * ROUTING_STATS_PERIOD_S,
                                        **({"request_router_class": PrefixCacheRequestRouter}
                                           if router == "prefix" else {}))
    serve.start(proxy_location=ProxyLocation.Disabled)  # the ingress is our own server, not Serve's proxy
    deployment = serve.deployment(
        EngineReplica, name=DEPLOYMENT_NAME, num_replicas=num_replicas,
        ray_actor_options={"num_cpus": threads_per_replica},
        max_ongoing_requests=engine_config.max_num_seqs * 2,  # running + a queue the engine itself holds
        request_router_config=router_config,
        health_check_period_s=HEALTH_CHECK_PERIOD_S, graceful_shutdown_timeout_s=5,
    )
    return serve.run(deployment.bind(engine_config, threads_per_replica), name=APP_NAME, route_prefix=None)


def shutdown() -> None:
    try:
        serve.delete(APP_NAME)
    finally:
        ray.shutdown()
