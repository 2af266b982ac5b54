"""The load generator's client pools: requests spread so that no pool holds more than its share in flight, every
verb and streaming answered as one httpx client answers them, every pool closed at the end."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from quill.clients.bench.client_pool import ClientPool


def test_requests_spread_over_pools_of_at_most_per_pool_in_flight():
    async def main():
        release, most = asyncio.Event(), []

        async def handler(request: httpx.Request) -> httpx.Response:
            most.append(max(pool.in_flight))
            await release.wait()
            return httpx.Response(200, json={"path": request.url.path, "method": request.method})

        pool = ClientPool(per_pool=2, base_url="http://quill", transport=httpx.MockTransport(handler))
        async with pool:
            posts = [asyncio.create_task(pool.post("/v1/completions", json={"i": i})) for i in range(7)]
            while len(most) < 7:
                await asyncio.sleep(0)
            assert len(pool.clients) == 4 and sorted(pool.in_flight) == [1, 2, 2, 2]
            release.set()
            answers = [r.json() for r in await asyncio.gather(*posts)]
            assert answers == [{"path": "/v1/completions", "method": "POST"}] * 7
            assert pool.in_flight == [0, 0, 0, 0] and max(most) <= 2
            assert (await pool.get("/health")).json()["method"] == "GET"
            async with pool.stream("POST", "/v1/completions", json={}) as response:
                assert pool.in_flight.count(1) == 1
                assert b"".join([chunk async for chunk in response.aiter_bytes()]).startswith(b'{"path"')
            assert len(pool.clients) == 4 and pool.in_flight == [0, 0, 0, 0]  # idle pools are reused
            clients = list(pool.clients)
        assert pool.clients == [] and all(c.is_closed for c in clients)

    asyncio.run(main())


def test_a_failed_request_leaves_its_pool_free():
    async def main():
        def handler(request: httpx.Request) -> httpx.Response:
            raise httpx.ConnectError("refused", request=request)

        async with ClientPool(per_pool=1, base_url="http://quill", transport=httpx.MockTransport(handler)) as pool:
            for _ in range(3):
                with pytest.raises(httpx.ConnectError):
                    await pool.post("/v1/completions", json={})
            assert pool.in_flight == [0]

    asyncio.run(main())
