"""A streaming agent for bench/streaming.py: raw asyncio, as fast as the loop allows.

Each request's payload says what to stream: ``chunks`` events of ``size`` bytes of text each,
then ``done``. Chunks are written as they are made, with the socket's backpressure honoured.

    python bench/stream_agent.py PORT
"""

from __future__ import annotations

import asyncio
import json
import sys


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = await reader.readexactly(length) if length else b"{}"
            if head.startswith(b"GET"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                continue
            payload = json.loads(body).get("payload", {})
            chunks, size = int(payload.get("chunks", 1)), int(payload.get("size", 16))
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            piece = json.dumps("x" * size).encode()
            for n in range(chunks):
                event = b"event: chunk\ndata: [%d,%s]\n\n" % (n, piece)
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                if writer.transport.get_write_buffer_size() > 256 * 1024:
                    await writer.drain()
            done = b'event: done\ndata: {"status":"SUCCESS"}\n\n'
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(serve, "127.0.0.1", port, backlog=2048)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
