"""`switchyard fields`: what each wire API does with the request fields it does not act on, as
the README shows it — generated from the tables (`gateway/<api>/fields.py`, `gateway.http.fields`)
so the README cannot drift from them (tests/gateway/http/test_fields.py compares the two).

    switchyard fields                 # every table, as Markdown
    switchyard fields chat messages   # some
    switchyard fields --readme README.md   # rewrite the README's generated blocks in place

Each table's block in the README sits between `<!-- fields:<api> -->` and `<!-- /fields:<api> -->`.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from gateway.chat_api.fields import CHAT_FIELDS, COMPLETIONS_FIELDS
from gateway.embeddings_api.fields import EMBEDDINGS_FIELDS
from gateway.http.fields import FieldTable
from gateway.messages_api.fields import COUNT_TOKENS_FIELDS, MESSAGES_FIELDS
from gateway.responses_api.fields import RESPONSES_FIELDS

TABLES: dict[str, FieldTable] = {table.api: table for table in (
    CHAT_FIELDS, COMPLETIONS_FIELDS, RESPONSES_FIELDS, MESSAGES_FIELDS, COUNT_TOKENS_FIELDS, EMBEDDINGS_FIELDS)}


def markdown(table: FieldTable) -> str:
    """The table's fields that are not acted on, one line each, with the reason."""
    parts = []
    if table.ignored:
        parts.append(f'Accepted and ignored (each counted in `switchyard_ignored_fields_total{{api="{table.api}"}}`):\n\n'
                     + "\n".join(f"- `{name}`: {why}" for name, why in sorted(table.ignored.items())))
    if table.refused:
        parts.append("Refused with a 400 naming the field:\n\n"
                     + "\n".join(f"- `{name}`: {why}" for name, why in sorted(table.refused.items())))
    return "\n\n".join(parts) or "Every field is acted on."


def block(table: FieldTable) -> str:
    """The table's README block, markers included."""
    return (f"<!-- fields:{table.api} (generated: switchyard fields --readme README.md) -->\n"
            f"{markdown(table)}\n<!-- /fields:{table.api} -->")


def _block_pattern(api: str) -> re.Pattern[str]:
    return re.compile(rf"<!-- fields:{re.escape(api)}\b.*?-->\n.*?<!-- /fields:{re.escape(api)} -->", re.DOTALL)


def readme_blocks(text: str) -> dict[str, str]:
    """The generated blocks a README holds, by API."""
    return {api: match.group(0) for api in TABLES if (match := _block_pattern(api).search(text))}


def rewrite_readme(text: str) -> str:
    """`text` with every table's block regenerated (a block must already be there)."""
    for api, table in TABLES.items():
        pattern = _block_pattern(api)
        if not pattern.search(text):
            raise ValueError(f"the README has no `<!-- fields:{api} -->` block; add one where the {api} API is described")
        text = pattern.sub(lambda _: block(table), text)
    return text


def _run(args: argparse.Namespace) -> int:
    if args.readme:
        path = Path(args.readme)
        path.write_text(rewrite_readme(path.read_text(encoding="utf-8")), encoding="utf-8")
        return 0
    unknown = [api for api in args.apis if api not in TABLES]
    if unknown:
        print(f"switchyard fields: unknown API {', '.join(unknown)} (known: {', '.join(TABLES)})")
        return 2
    for api in args.apis or TABLES:
        print(f"## {api}\n{markdown(TABLES[api])}\n")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("fields", help="what each API does with the request fields it does not act on")
    parser.add_argument("apis", nargs="*", help=f"some of: {', '.join(TABLES)} (default: all)")
    parser.add_argument("--readme", default=None, metavar="README.md", help="rewrite the README's generated blocks")
    parser.set_defaults(func=_run)
