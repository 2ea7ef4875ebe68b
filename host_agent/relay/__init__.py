"""Relayed sessions (docs/remote.md): a GPU-less host's sessions carried to a GPU host's oriond over RDMA or TCP.

The relaying end: route.py (RelayRoute, the session loop's SessionRoute: where a session goes, the cluster-key
handshake, the connection) and relayed_session.py (Relay: a ring's records carried over the connection, with its
page-locked pool and mirror: pool.py, mirror.py, uva.py). The GPU host's end: listener.py (the listening socket,
admission, one worker per session) and worker.py (RELAY_HELLO, then the same session loop and executor as a
region's). Between them, one declared stream interface (frames.py's FrameStream over TCP, rdma_stream.py's
RdmaStream; stream_endpoint.py makes either a session transport).

The relay imports the ground floor and, on the GPU host, the session executor's page-locked pool and compiled hot
path; never the daemon. What does not belong here: what a record means (session/), serving regions (daemon/).
"""
