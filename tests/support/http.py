"""Requests to the suite's own servers: httpx's calls, without a TLS context.

`httpx.post` (and `get`, `stream`, ...) builds a client per call, and a
client with TLS verification loads the CA bundle: 17 ms of CPU each time,
11 CPU-seconds over the default run, for servers that speak plain HTTP on
the loopback address. These are the same calls with `verify=False` (no CA
bundle is read; no TLS is spoken either way).
"""

import functools

import httpx

get = functools.partial(httpx.get, verify=False)
post = functools.partial(httpx.post, verify=False)
options = functools.partial(httpx.options, verify=False)
stream = functools.partial(httpx.stream, verify=False)
