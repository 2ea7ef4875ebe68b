"""Which session may take up a grant, and which may give it back (docs/security.md, "Who may talk to whom").

An allocation id is all a session shows for its grant. So the controller binds a grant to exactly one session, named
by its GPU host, a session id unique on that host and, for a relayed session, the member that relayed it there; and
only a session of the host the grant was asked from or for may be that one. pool.py applies these checks inside
its compare-and-swap loops; the rules themselves live here, apart from the etcd mechanics.
"""
from __future__ import annotations

from controller.errors import AlreadyBound, Forbidden, WrongSession
from controller.model import Allocation


def check_binding(alloc: Allocation, binding: dict[str, str]) -> None:
    """Refuse to bind ``alloc`` to the session ``binding`` names unless that session may hold it (see confirm)."""
    from_host = binding["relay_member"] or binding["host"]
    if alloc.origin and from_host != alloc.origin:
        by = f"relayed by {from_host}" if binding["relay_member"] else f"local to {from_host}"
        raise Forbidden(f"allocation {alloc.id} was asked for host {alloc.origin}: a session {by} may not take it "
                        f"up; only the guest it was granted to can use it")
    if alloc.bound_to and alloc.bound_to != binding:
        raise AlreadyBound(f"allocation {alloc.id} is taken up by another session already (on host "
                           f"{alloc.bound_to.get('host', '?')}): one grant backs one session; ask the controller "
                           f"for a new allocation")


def check_release(alloc: Allocation, member: str, session: str) -> None:
    """Refuse a member's release of ``alloc`` for ``session`` unless that is the session bound to it."""
    bound = alloc.bound_to
    if bound and member != bound.get("host"):
        raise Forbidden(f"allocation {alloc.id} is held by a session of host {bound.get('host')}; member {member} "
                        f"may not release it for that host")
    if session and session != bound.get("session"):
        raise WrongSession(f"allocation {alloc.id} is not bound to session {session} of host {member}; only the "
                           f"session that took it up gives it back when it ends")
