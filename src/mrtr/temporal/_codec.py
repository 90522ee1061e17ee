"""Sealed at rest on Temporal: a payload codec that seals every payload with the server's key ring.

The lease runtime seals task records before they reach its store (`mrtr.stores.SealedStore`);
on Temporal the journal, arguments, answers, step results and results travel as payloads of
workflows, activities, updates, queries and memos, and Temporal keeps every one of them in its
history. Temporal's own answer is a `PayloadCodec`: the client and the workers encode payloads
on the way out and decode them on the way in, and the server only ever stores what they
encoded. This codec seals each payload whole (its metadata and data, serialised) into one token
of the SDK's codec (`RequestStateSecurity(keys=...).codec`, AES-GCM: no crypto of mrtr's own)
under the `binary/mrtr-sealed` encoding, so `temporal workflow show` prints ciphertext.

`TemporalTasks` installs it on its client when `Flows` hands it the server's key ring
(`seal_at_rest`, on by default): every process of the fleet (MCP servers and worker-only
processes) must then hold the ring, as for `requestState`. Payloads written before (plain)
still decode; the first key seals, every key of the ring opens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import PayloadCodec

from mrtr.stores._sealed import RecordSeal

ENCODING = b"binary/mrtr-sealed"
"""The `encoding` metadata of a sealed payload (what a codec server for Temporal's UI decodes)."""


class SealingCodec(PayloadCodec):
    """Seals payloads with a key ring on encode; opens sealed ones (and passes plain ones) on decode."""

    def __init__(self, seal: RecordSeal) -> None:
        self.seal = seal

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        codec = self.seal.codec
        if codec is None:  # no shared ring: nothing to seal with (the start-up key warning says so)
            return list(payloads)
        return [
            Payload(metadata={"encoding": ENCODING}, data=codec.seal(payload.SerializeToString()).encode())
            for payload in payloads
        ]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        opened: list[Payload] = []
        for payload in payloads:
            if payload.metadata.get("encoding") != ENCODING:
                opened.append(payload)  # plain: written before sealing, or by a process without it
                continue
            codec = self.seal.codec
            if codec is None:
                raise ValueError("a payload is sealed at rest and this process has no key ring to open it")
            inner = Payload()
            inner.ParseFromString(codec.unseal(payload.data.decode()))
            opened.append(inner)
        return opened


def sealed_client(client: Client, seal: RecordSeal) -> Client:
    """`client` with `SealingCodec` as its payload codec (the same connection and namespace).

    A client that already has a codec of its own keeps it: the user chose how its payloads are
    encoded (mrtr does not stack a second codec on it).
    """
    config = client.config()
    converter = config["data_converter"]
    if converter.payload_codec is not None:
        return client
    config["data_converter"] = dataclasses.replace(converter, payload_codec=SealingCodec(seal))
    return Client(**config)


__all__ = ["ENCODING", "SealingCodec", "sealed_client"]
