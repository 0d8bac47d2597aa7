"""Generate ``src/warden_client/aclient.py`` from ``client.py``: the same
API with ``async`` methods over ``httpx.AsyncClient``.

    python3 scripts/gen_async.py          # rewrite aclient.py
    python3 scripts/gen_async.py --check  # exit 1 if it is not current
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "warden_client"

# (old, new, how many times it must occur)
EXACT = [
    ('"""The synchronous client (``httpx.Client``).\n\n``aclient.py`` is the same API with '
     '``async`` methods; it is generated from\nthis file by ``scripts/gen_async.py`` (a test '
     'checks that it is current).\n"""',
     '"""The asynchronous client (``httpx.AsyncClient``): the API of ``client.py``\nwith '
     '``async`` methods.\n\nGenerated from ``client.py`` by ``scripts/gen_async.py``; do not edit.\n"""',
     1),
    ("import time\n", "import asyncio\n", 1),
    ('__all__ = ["WardenClient"]', '__all__ = ["AsyncWardenClient"]', 1),
    ("class WardenClient:", "class AsyncWardenClient:", 1),
    ('"WardenClient"', '"AsyncWardenClient"', 2),
    ("return WardenClient(", "return AsyncWardenClient(", 1),
    ("httpx.BaseTransport", "httpx.AsyncBaseTransport", 1),
    ("httpx.Client", "httpx.AsyncClient", 2),
    ("    def close(self) -> None:", "    async def close(self) -> None:", 1),
    ("self._http.close()", "await self._http.aclose()", 1),
    ("    def __enter__(self)", "    async def __aenter__(self)", 1),
    ("    def __exit__(self, *exc: object) -> None:\n        if self._owns_http:\n            self.close()",
     "    async def __aexit__(self, *exc: object) -> None:\n        if self._owns_http:\n            await self.close()",
     1),
    ("return self._send_once(", "return await self._send_once(", 1),
    ("time.sleep(", "await asyncio.sleep(", 1),
    ("resp = self._http.request(", "resp = await self._http.request(", 1),
    ("page = self.audit(", "page = await self.audit(", 1),
    ("return self.get_session(session_id).envelope",
     "return (await self.get_session(session_id)).envelope", 1),
]

SYNC_ONLY = ("__init__", "with_token", "__aenter__", "__aexit__", "close")


def generate(source: str) -> str:
    out = source
    for old, new, count in EXACT:
        found = out.count(old)
        if found != count:
            raise SystemExit(f"gen_async: expected {count} of {old!r}, found {found}")
        out = out.replace(old, new)
    out = out.replace("return self.send(", "return await self.send(")

    def make_async(match: "re.Match[str]") -> str:
        name = match.group(1)
        return match.group(0) if name in SYNC_ONLY else f"    async def {name}("

    return re.sub(r"^    def (\w+)\(", make_async, out, flags=re.M)


def main() -> int:
    source = (PACKAGE / "client.py").read_text()
    generated = generate(source)
    target = PACKAGE / "aclient.py"
    if "--check" in sys.argv[1:]:
        if target.read_text() != generated:
            print("aclient.py is not current: run python3 scripts/gen_async.py", file=sys.stderr)
            return 1
        return 0
    target.write_text(generated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
