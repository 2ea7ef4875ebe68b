/* vgpu_lease.c: vGPUs from the Orion Controller (ORION_VGPU) on the native driver (docs/native-driver.md, "vGPUs").
 *
 * As on the capsule path (guest_runtime/activate.py), at the process's first connection: ask the agent which host
 * it is (AGENT_INFO), have the controller grant ORION_VGPU vGPUs there, then BIND the grant to the session before
 * its first context. The controller's side -- the request, the lease's keep-alives, the release with Orion's exit
 * line -- is guest_runtime/vgpu_lease.py, run as a helper process that lives as long as this one: a program on
 * the native driver need not be Python, and Python code never runs inside a driver call. The helper reads a
 * socket this process holds open (never closed here): its end of file, however the process ends, is the release.
 *
 * A grant is shared with the processes this one starts (host_agent/session/grant_sharing.py): after BIND the session's
 * token goes into ORION_GRANT (GRANT_SHARE), and a process that finds ORION_GRANT joins that grant (GRANT_JOIN)
 * instead of asking the controller. A join refused (its holder gone, a token of another guest) is said once, and the
 * process asks the controller for its own. An agent that predates sharing answers UNKNOWN_OPCODE: nothing is shared.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "orion_region.h" /* generated: the AGENT_INFO and BIND payloads' places, the wire's opcodes and statuses */
#include "orion_wire.h"

extern char **environ;

/* Seconds the helper may take to answer; the bytes kept of an AGENT_INFO reply and of a refused BIND's reason; the
 * longest BIND or GRANT_JOIN payload sent; the longest grant token. */
enum { HELPER_ANSWER_S = 60, AGENT_INFO_REPLY_CAP = 1024, BIND_REPLY_CAP = 512, REQUEST_CAP = 512,
       GRANT_TOKEN_MAX = 64 };

/* Run by the interpreter the start-up hook names (ORION_PYTHON), with the directory guest_runtime is in first. */
static const char HELPER[] =
    "import os, sys\n"
    "root = os.environ.get('ORION_GUEST_ROOT')\n"
    "if root: sys.path.insert(0, root)\n"
    "from guest_runtime.vgpu_lease import main\n"
    "sys.exit(main(sys.argv[1:]))\n";

int orion_vgpus_wanted(void) {
    const char *v = getenv("ORION_VGPU");
    while (v && (*v == ' ' || *v == '\t')) v++;
    return v && *v;
}

/* AGENT_INFO: the host's name in the controller's pool ("" when its agent has no controller); *predates when the
 * agent does not know the opcode. */
static int agent_host(orion_channel *channel, char *host, size_t cap, int *predates, char *err, size_t errlen) {
    uint8_t reply[AGENT_INFO_REPLY_CAP];
    size_t got = 0;
    int32_t status = 0;
    int rc = orion_call(channel, ORION_WIRE_OP_AGENT_INFO, NULL, 0, &status, reply, sizeof reply, &got);
    if (rc != ORION_OK) {
        snprintf(err, errlen, "asking the host agent its name failed: %s", orion_error(channel));
        return -1;
    }
    *predates = status == ORION_WIRE_STATUS_UNKNOWN_OPCODE;
    host[0] = 0;
    uint32_t len = 0;  /* record.AGENT_INFO_REPLY: host (a u32 length, its bytes), then controller */
    const size_t at = ORION_AGENT_INFO_REP_host + ORION_LENGTH_BYTES;
    if (status == 0 && got >= at && (memcpy(&len, reply + ORION_AGENT_INFO_REP_host, sizeof len),
                                     len < cap && len <= got - at)) {
        memcpy(host, reply + at, len);
        host[len] = 0;
    }
    return 0;
}

/* Starts the helper; its answer line in `line`, the socket it reads in *lease. */
static int ask_helper(const char *where, const char *host, int predates, int *lease, char *line, size_t cap,
                      char *err, size_t errlen) {
    int control[2], answer[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, control) != 0) {
        snprintf(err, errlen, "socketpair for the vGPU lease: %s", strerror(errno));
        return -1;
    }
    if (pipe2(answer, O_CLOEXEC) != 0) {
        snprintf(err, errlen, "pipe for the vGPU lease: %s", strerror(errno));
        close(control[0]);
        close(control[1]);
        return -1;
    }
    const char *python = getenv("ORION_PYTHON");
    if (!python || !*python) python = "python3";
    char *argv[] = { (char *)python, "-c", (char *)HELPER, (char *)where, (char *)host,
                     predates ? "--predates" : NULL, NULL };
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, control[1], 0);
    posix_spawn_file_actions_adddup2(&actions, answer[1], 1);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    /* Nothing of the program but stdin, stdout and stderr: an inheritable descriptor it holds (a pipe's write end,
     * a listening socket) must not stay open in a helper that lives as long as the program. Older C libraries
     * lack this action; there the helper inherits what the program did not mark close-on-exec. */
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);
#endif
    pid_t pid = 0;
    int spawned = posix_spawnp(&pid, python, &actions, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(control[1]);
    close(answer[1]);
    if (spawned != 0) {
        snprintf(err, errlen, "cannot start %s for the vGPU lease (%s): set ORION_PYTHON to a Python with "
                 "orion-guest installed", python, strerror(spawned));
        close(control[0]);
        close(answer[0]);
        return -1;
    }
    size_t n = 0;
    int done = 0;
    while (!done && n + 1 < cap) {
        struct pollfd p = { answer[0], POLLIN, 0 };
        int ready = poll(&p, 1, HELPER_ANSWER_S * 1000);
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) break;
        ssize_t r = read(answer[0], line + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
        done = memchr(line, '\n', n) != NULL;
    }
    close(answer[0]);
    line[n] = 0;
    if (!done) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(control[0]);
        snprintf(err, errlen, "the vGPU lease helper (%s guest_runtime.vgpu_lease) gave no answer in %d s; check "
                 "that %s has orion-guest installed (ORION_PYTHON)", python, HELPER_ANSWER_S, python);
        return -1;
    }
    *strchr(line, '\n') = 0;
    *lease = control[0]; /* held for the process's life: the helper's end of file is the release */
    return 0;
}

/* A wire request whose payload is one string at offset `at` (a u32 length, its bytes): 0 when the agent took it,
 * else -1 and the agent's reason (or what went wrong) in `reason`. */
static int call_with_text(orion_channel *channel, int opcode, size_t at, const char *what, const char *text,
                          char *reason, size_t cap) {
    uint8_t request[REQUEST_CAP], reply[BIND_REPLY_CAP];
    uint32_t len = (uint32_t)strlen(text);
    if (at + ORION_LENGTH_BYTES + len > sizeof request) {
        snprintf(reason, cap, "%s of %u bytes", what, len);
        return -1;
    }
    memcpy(request + at, &len, sizeof len);
    memcpy(request + at + ORION_LENGTH_BYTES, text, len);
    int32_t status = 0;
    size_t got = 0;
    int rc = orion_call(channel, opcode, request, at + ORION_LENGTH_BYTES + len, &status, reply, sizeof reply - 1,
                        &got);
    if (rc == ORION_OK && status == 0) return 0;
    if (rc != ORION_OK) snprintf(reason, cap, "%s", orion_error(channel));
    else if (status == ORION_WIRE_STATUS_UNKNOWN_OPCODE) snprintf(reason, cap, "the host agent predates it");
    else snprintf(reason, cap, "%.*s", (int)(got < sizeof reply - 1 ? got : sizeof reply - 1), (char *)reply);
    return -1;
}

/* BIND: the grant becomes this session's devices and quotas (refused with the agent's reason otherwise). */
static int bind_grant(orion_channel *channel, const char *id, char *reason, size_t cap) {
    return call_with_text(channel, ORION_WIRE_OP_BIND, ORION_BIND_REQ_allocation, "an allocation id", id, reason, cap);
}

/* GRANT_JOIN of the token in ORION_GRANT: 0 when this session took up that grant. */
static int join_grant(orion_channel *channel, const char *token, char *reason, size_t cap) {
    return call_with_text(channel, ORION_WIRE_OP_GRANT_JOIN, ORION_GRANT_JOIN_REQ_token, "ORION_GRANT", token, reason,
                          cap);
}

/* GRANT_SHARE: the session's token into ORION_GRANT, for the processes this one starts (nothing where the agent
 * does not share it: a relayed session, an agent that predates sharing). */
static void share_grant(orion_channel *channel) {
    uint8_t reply[ORION_GRANT_SHARE_REP_token + ORION_LENGTH_BYTES + GRANT_TOKEN_MAX + 1];
    int32_t status = 0;
    size_t got = 0;
    int rc = orion_call(channel, ORION_WIRE_OP_GRANT_SHARE, NULL, 0, &status, reply, sizeof reply - 1, &got);
    uint32_t len = 0;
    const size_t at = ORION_GRANT_SHARE_REP_token + ORION_LENGTH_BYTES;
    if (rc != ORION_OK || status != 0 || got < at) return;
    memcpy(&len, reply + ORION_GRANT_SHARE_REP_token, sizeof len);
    if (len == 0 || len > GRANT_TOKEN_MAX || len > got - at) return;
    char token[GRANT_TOKEN_MAX + 1];
    memcpy(token, reply + at, len);
    token[len] = 0;
    setenv("ORION_GRANT", token, 1); /* at the first connection, before the program starts anything */
}

int orion_take_up_vgpus(orion_channel *channel, const char *where, char *err, size_t errlen) {
    static int lease = -1;
    char host[256], line[1024];
    int predates = 0;
    const char *token = getenv("ORION_GRANT");
    if (token && *token) {
        char reason[512];
        if (join_grant(channel, token, reason, sizeof reason) == 0) return 0;
        fprintf(stderr, "orion: did not join the vGPUs of the process that shared them (%s); asking the Orion "
                "Controller for this process's own\n", reason);
    }
    if (agent_host(channel, host, sizeof host, &predates, err, errlen) != 0) return -1;
    if (ask_helper(where, host, predates, &lease, line, sizeof line, err, errlen) != 0) return -1;
    if (strcmp(line, "NONE") == 0) return 0;
    if (strncmp(line, "ERROR ", 6) == 0) {
        snprintf(err, errlen, "%s", line + 6);
        return -1;
    }
    if (strncmp(line, "ALLOCATION ", 11) != 0) {
        snprintf(err, errlen, "the vGPU lease helper answered %.200s", line);
        return -1;
    }
    const char *id = line + 11;
    char reason[512];
    if (bind_grant(channel, id, reason, sizeof reason) == 0) {
        share_grant(channel);
        return 0;
    }
    send(lease, "abandon\n", 8, MSG_NOSIGNAL);
    snprintf(err, errlen, "host %s did not take up allocation %s: %s", host, id, reason);
    return -1;
}
