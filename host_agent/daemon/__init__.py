"""oriond itself: its command line and configuration, the process tree it supervises (a process per region, each
forking a worker per session; the relay listener), region serving (region_server.py), the pid file, and the link
that registers this host's GPUs with the Orion Controller.

The daemon composes the other folders: it hands each region worker the session executor (session/) as its handler
and, on a host that relays, the relay route (relay/) as the session loop's SessionRoute; nothing in those folders
imports this one. What does not belong here: what a record means (session/), how a relay connection is carried
(relay/), libvirt (kvm/), the administration commands (admin/).
"""
