"""`radixserve serve --replicas N`: the usual server as ingress, N engine replicas on Ray Serve.

The ingress is server.app.create_app's app with a ReplicaEngine as its engine: auth,
validation, retrieval, assembly and tokenization happen here once; replicas get token ids.
"""

import argparse
import logging

from assembly.chat_template import ChatTemplate, TemplateError
from store.errors import RadixserveError
from replicas import cluster
from replicas.prefix_policy import PrefixRoutingPolicy
from replicas.replica_config import ReplicaConfig
from replicas.replica_engine import ReplicaEngine
from replicas.routing_state import RoutingState
from replicas.session_key import SessionKeyMiddleware

logger = logging.getLogger("radixserve.server")


def build_ingress_app(settings, handle, routing: RoutingState, router: str = "prefix"):
    """The ASGI app: create_app's, engine served by the replicas, session header read first."""
    from server.app import create_app

    can_target = router == "prefix"
    return SessionKeyMiddleware(create_app(settings, engine_factory=lambda _: ReplicaEngine.connect(
        handle, routing, can_target)))


def serve_replicas(args: argparse.Namespace, replicas: ReplicaConfig) -> int:
    from store.model_store import pull
    from server.serve_command import configure_logging, run_server, settings_from_args

    model_dir = pull(args.model, progress=True)
    settings = settings_from_args(args, model_dir)
    if settings.chat_template_path is not None:
        try:
            ChatTemplate.from_model_dir(model_dir, settings.chat_template_path)
        except TemplateError as error:
            raise RadixserveError(f"--chat-template: {error}") from None
    configure_logging()
    logger.info("radixserve: starting %d replicas x %d threads on Ray%s", replicas.count,
                replicas.threads_per_replica, f" at {replicas.ray_address}" if replicas.ray_address else " (local)")
    cluster.start_ray(replicas.ray_address, num_cpus=replicas.count * replicas.threads_per_replica)
    try:
        handle = cluster.deploy_replicas(settings.engine, replicas.count, replicas.threads_per_replica,
                                         replicas.router)
        routing = RoutingState(PrefixRoutingPolicy(thresholds=replicas.thresholds))
        if replicas.router != "prefix" and settings.engine.documents.enabled:
            logger.warning("radixserve: with --replica-router %s, documents added to a collection get no "
                           "precomputed KV (each replica computes a document the first time a prompt holds it)",
                           replicas.router)
        return run_server(build_ingress_app(settings, handle, routing, replicas.router), settings)
    finally:
        cluster.shutdown()
