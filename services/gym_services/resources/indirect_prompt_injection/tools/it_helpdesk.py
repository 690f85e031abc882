"""IT helpdesk: assets, knowledge-base articles, incidents (plus messaging).

Environment: ``assets``, ``knowledge_base_articles``, ``incidents`` (dicts keyed by ID, each may be
absent), ``messages``, ``current_user``. New incidents get ``INC-`` and six hex digits and start
``Open``.
"""

from __future__ import annotations

from typing import Any

from gym_services.resources.indirect_prompt_injection.state import new_id
from gym_services.resources.indirect_prompt_injection.tools.common import Handler, lookup, same_text, text_contains


def _asset_matches(asset, tag, type, status, location) -> bool:
    if tag and tag.lower() not in asset.get("tag", "").lower():
        return False
    if type and not same_text(asset, "type", type):
        return False
    if status and not same_text(asset, "status", status):
        return False
    return not location or location.lower() in asset.get("location", "").lower()


def search_assets(env, tag=None, type=None, status=None, location=None, **kwargs) -> list[Any]:
    """Assets whose tag or location contains the given text, of a type, in a status."""
    return [a for a in env.get("assets", {}).values() if _asset_matches(a, tag, type, status, location)]


def get_asset(env, asset_id) -> Any:
    return lookup(env.get("assets", {}), asset_id, {"error": f"Asset {asset_id} not found."})


def update_asset_notes(env, asset_id, notes) -> str:
    assets = env.get("assets", {})
    if asset_id not in assets:
        return f"Error: Asset {asset_id} not found."
    assets[asset_id]["notes"] = notes
    return f"Asset {asset_id} notes updated."


def _mentions(record, keyword, fields: tuple[str, str]) -> bool:
    needle = keyword.lower()
    first = text_contains(needle, record, fields[0])
    second = text_contains(needle, record, fields[1])
    return first or second


def search_kb_articles(env, keyword=None, category=None, **kwargs) -> list[Any]:
    hits = []
    for article in env.get("knowledge_base_articles", {}).values():
        if category and not same_text(article, "category", category):
            continue
        if keyword and not _mentions(article, keyword, ("title", "content")):
            continue
        hits.append(article)
    return hits


def get_kb_article(env, article_id) -> Any:
    return lookup(env.get("knowledge_base_articles", {}), article_id, {"error": f"Article {article_id} not found."})


def update_kb_article_content(env, article_id, content) -> str:
    articles = env.get("knowledge_base_articles", {})
    if article_id not in articles:
        return f"Error: Article {article_id} not found."
    articles[article_id]["content"] = content
    return f"Article {article_id} content updated."


def search_incidents(env, keyword=None, status=None, priority=None, **kwargs) -> list[Any]:
    hits = []
    for incident in env.get("incidents", {}).values():
        if status and not same_text(incident, "status", status):
            continue
        if priority and not same_text(incident, "priority", priority):
            continue
        if keyword and not _mentions(incident, keyword, ("title", "description")):
            continue
        hits.append(incident)
    return hits


def get_incident(env, ticket_id) -> Any:
    return lookup(env.get("incidents", {}), ticket_id, {"error": f"Incident {ticket_id} not found."})


def update_incident_description(env, ticket_id, description) -> str:
    incidents = env.get("incidents", {})
    if ticket_id not in incidents:
        return f"Error: Incident {ticket_id} not found."
    incidents[ticket_id]["description"] = description
    return f"Incident {ticket_id} description updated."


def create_incident(env, title, description, priority, assigned_to) -> str:
    ticket_id = new_id("INC-")
    env.setdefault("incidents", {})[ticket_id] = {
        "ticket_id": ticket_id,
        "title": title,
        "description": description,
        "status": "Open",
        "priority": priority,
        "assigned_to": assigned_to,
    }
    return f"Incident {ticket_id} created."


#: shared tools (tools/common.py) this domain offers too
SHARED = ("send_message", "get_messages")

TOOLS: dict[str, Handler] = {
    "search_assets": search_assets,
    "get_asset": get_asset,
    "update_asset_notes": update_asset_notes,
    "search_kb_articles": search_kb_articles,
    "get_kb_article": get_kb_article,
    "update_kb_article_content": update_kb_article_content,
    "search_incidents": search_incidents,
    "get_incident": get_incident,
    "update_incident_description": update_incident_description,
    "create_incident": create_incident,
}
