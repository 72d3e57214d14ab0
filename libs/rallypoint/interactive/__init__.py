"""Interactive sessions: a rank's pseudo-terminal relayed to the user through the cluster.

The path of every byte, and who holds what (docs/api.md, "Terminals"; docs/security.md):

    rally run --pty / rally attach          the user's terminal, in raw mode (``cli``)
        | WebSocket, the user's token       GET /v1/jobs/{id}/terminal (``services.api.terminal``)
    API
        | core NATS: cmd.agent.<node>.tty   open, input, resize, keepalive (the API's user only)
        | core NATS: tty.<node>.<session>   output, exit (that node's agent only)
    node agent                              ``agent.terminal``
        | Unix socket in the attempt folder (the agent's work dir, mode 700)
    rank wrapper                            holds the pty master (``agent.rankwrap --pty``)
        | pty
    the rank (a shell)

Every hop carries the same frames (``frames``): a type byte and a payload.
"""
