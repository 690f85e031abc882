"""Real estate: clients, inspections, property listings (plus messaging).

Environment: ``clients``, ``inspection_reports``, ``property_listings`` (dicts keyed by ID, each may be
absent), ``messages``, ``current_user``. New inspection reports get ``IR-`` and six hex digits (with
empty findings), properties ``PROP-``.
"""

from __future__ import annotations

from typing import Any

from gym_services.resources.indirect_prompt_injection.state import new_id
from gym_services.resources.indirect_prompt_injection.tools.common import Handler, lookup, text_contains


def list_clients(env, **kwargs) -> list[Any]:
    return list(env.get("clients", {}).values())


def get_client_details(env, client_id) -> Any:
    return lookup(env.get("clients", {}), client_id, {"error": f"Client {client_id} not found."})


def add_client_note(env, client_id, notes) -> str:
    """Replace the client's notes."""
    clients = env.get("clients", {})
    if client_id not in clients:
        return f"Error: Client {client_id} not found."
    clients[client_id]["notes"] = notes
    return f"Notes updated for client {client_id}."


def schedule_inspection(env, property_id, inspector_name, inspection_date) -> str:
    report_id = new_id("IR-")
    env.setdefault("inspection_reports", {})[report_id] = {
        "report_id": report_id,
        "property_id": property_id,
        "inspector_name": inspector_name,
        "inspection_date": inspection_date,
        "findings": "",
        "recommendations": "",
        "overall_condition": "",
    }
    return f"Inspection {report_id} scheduled for property {property_id}."


def get_inspection_report(env, report_id) -> Any:
    return lookup(env.get("inspection_reports", {}), report_id, {"error": f"Inspection report {report_id} not found."})


def submit_inspection_findings(env, report_id, findings, recommendations) -> str:
    reports = env.get("inspection_reports", {})
    if report_id not in reports:
        return f"Error: Inspection report {report_id} not found."
    reports[report_id]["findings"] = findings
    reports[report_id]["recommendations"] = recommendations
    return f"Findings submitted for inspection report {report_id}."


def _property_matches(listing, keywords, min_price, max_price, location) -> bool:
    if min_price is not None and listing.get("price", 0) < min_price:
        return False
    if max_price is not None and listing.get("price", 0) > max_price:
        return False
    if location and location.lower() not in listing.get("address", "").lower():
        return False
    if keywords:
        needle = keywords.lower()
        in_address = text_contains(needle, listing, "address")
        in_description = text_contains(needle, listing, "description")
        if not (in_address or in_description):
            return False
    return True


def search_properties(env, keywords=None, min_price=None, max_price=None, location=None, **kwargs) -> list[Any]:
    """Listings within a price range, at a location, mentioning keywords in address or description."""
    listings = env.get("property_listings", {}).values()
    return [p for p in listings if _property_matches(p, keywords, min_price, max_price, location)]


def get_property_details(env, property_id) -> Any:
    return lookup(env.get("property_listings", {}), property_id, {"error": f"Property {property_id} not found."})


def create_property(
    env, address, price, bedrooms, bathrooms, description=None, status="active", listing_date=None, **kwargs
) -> str:
    property_id = new_id("PROP-")
    listing = {
        "property_id": property_id,
        "address": address,
        "price": price,
        "bedrooms": bedrooms,
        "bathrooms": bathrooms,
        "status": status,
    }
    if description:
        listing["description"] = description
    if listing_date:
        listing["listing_date"] = listing_date
    env.setdefault("property_listings", {})[property_id] = listing
    return f"Property {property_id} created at {address}."


def update_property_description(env, property_id, description) -> str:
    listings = env.get("property_listings", {})
    if property_id not in listings:
        return f"Error: Property {property_id} not found."
    listings[property_id]["description"] = description
    return f"Property {property_id} description updated."


#: shared tools (tools/common.py) this domain offers too
SHARED = ("get_messages", "send_message")

TOOLS: dict[str, Handler] = {
    "list_clients": list_clients,
    "get_client_details": get_client_details,
    "add_client_note": add_client_note,
    "schedule_inspection": schedule_inspection,
    "get_inspection_report": get_inspection_report,
    "submit_inspection_findings": submit_inspection_findings,
    "search_properties": search_properties,
    "get_property_details": get_property_details,
    "create_property": create_property,
    "update_property_description": update_property_description,
}
