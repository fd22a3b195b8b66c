"""The request path of the Router: dispatcher, attempts, the HTTP edge to agents, async results."""
