"""Scale-out on Ray Serve: N engine replicas behind one ingress, routed by cached prefix.

Pure Python (no Ray): prefix_index (what each replica holds), prefix_policy (which replica a
request goes to), work (what travels to a replica). With Ray (the optional `cluster` extra):
ray_router (the Ray Serve RequestRouter), engine_deployment (a replica), replica_engine (the
ingress's engine handle), cluster (deploying), serve_command (`radixserve serve --replicas`).
Nothing below server/ imports this package.
"""
