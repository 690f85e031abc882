"""Logistics: carrier messages, customs declarations, delivery schedules, shipments, warehouse stock.

Environment: ``shipments``, ``customs_declarations``, ``delivery_schedules``,
``warehouse_inventories`` (dicts keyed by ID, each may be absent), ``carrier_messages`` (list or dict
keyed by message ID), ``current_user``. IDs of new records: carrier messages ``CM-``, declarations
``CD-``, inventory items ``INV-``, each with six hex digits.
"""

from __future__ import annotations

from typing import Any

from gym_services.resources.indirect_prompt_injection.state import new_id
from gym_services.resources.indirect_prompt_injection.tools.common import Handler, lookup

FALLBACK_SENDER = "system@logistics.example"


def get_carrier_messages(env, shipment_id=None, **kwargs) -> list[Any]:
    box = env.get("carrier_messages", {})
    found = list(box.values()) if isinstance(box, dict) else list(box)
    if shipment_id:
        found = [m for m in found if m.get("shipment_id") == shipment_id]
    return found


def send_carrier_message(env, to, subject, body) -> str:
    user = env.get("current_user", {})
    sender = user.get("email") or user.get("name", FALLBACK_SENDER)
    message_id = new_id("CM-")
    message = {
        "message_id": message_id,
        "from": sender,
        "to": to,
        "subject": subject,
        "body": body,
        "timestamp": "sent",
    }
    if isinstance(env.get("carrier_messages"), dict):
        env["carrier_messages"][message_id] = message
    else:
        env.setdefault("carrier_messages", []).append(message)
    return f"Carrier message sent to {to}."


def _first_for_shipment(env, collection: str, shipment_id) -> Any:
    for record in env.get(collection, {}).values():
        if record.get("shipment_id") == shipment_id:
            return record
    return None


def get_customs_declaration_by_shipment(env, shipment_id) -> Any:
    found = _first_for_shipment(env, "customs_declarations", shipment_id)
    return found if found is not None else {"error": f"No customs declaration found for shipment {shipment_id}."}


def submit_customs_declaration(
    env, shipment_id, hs_code, declared_value, additional_info=None, **kwargs
) -> dict[str, Any]:
    """Update the shipment's declaration and mark it submitted, or file a new one."""
    declaration = _first_for_shipment(env, "customs_declarations", shipment_id)
    if declaration is not None:
        declaration["hs_code"] = hs_code
        declaration["declared_value"] = declared_value
        if additional_info is not None:
            declaration["additional_info"] = additional_info
        declaration["status"] = "submitted"
        return declaration
    declaration_id = new_id("CD-")
    declaration = {
        "declaration_id": declaration_id,
        "shipment_id": shipment_id,
        "hs_code": hs_code,
        "declared_value": declared_value,
        "status": "submitted",
    }
    if additional_info is not None:
        declaration["additional_info"] = additional_info
    env.setdefault("customs_declarations", {})[declaration_id] = declaration
    return declaration


def get_delivery_schedule(env, shipment_id) -> Any:
    found = _first_for_shipment(env, "delivery_schedules", shipment_id)
    return found if found is not None else {"error": f"No delivery schedule found for shipment {shipment_id}."}


def get_shipment_by_id(env, shipment_id) -> Any:
    return lookup(env.get("shipments", {}), shipment_id, {"error": f"Shipment {shipment_id} not found."})


def search_shipments_by_status(env, status) -> list[Any]:
    wanted = status.lower()
    return [s for s in env.get("shipments", {}).values() if s.get("status", "").lower() == wanted]


def update_shipment_status(env, shipment_id, status, eta=None, notes=None, **kwargs) -> str:
    shipments = env.get("shipments", {})
    if shipment_id not in shipments:
        return f"Error: Shipment {shipment_id} not found."
    shipment = shipments[shipment_id]
    shipment["status"] = status
    if eta is not None:
        shipment["eta"] = eta
    if notes is not None:
        shipment["notes"] = notes
    return f"Shipment {shipment_id} updated to status '{status}'."


def get_warehouse_inventory_item(env, inventory_id) -> Any:
    return lookup(
        env.get("warehouse_inventories", {}), inventory_id, {"error": f"Inventory item {inventory_id} not found."}
    )


def list_low_stock_items(env, threshold) -> list[Any]:
    return [item for item in env.get("warehouse_inventories", {}).values() if item.get("quantity", 0) < threshold]


def add_warehouse_inventory(env, sku, description, quantity, warehouse_location, comments=None, **kwargs) -> str:
    inventory_id = new_id("INV-")
    item = {
        "inventory_id": inventory_id,
        "sku": sku,
        "description": description,
        "quantity": quantity,
        "warehouse_location": warehouse_location,
    }
    if comments is not None:
        item["comments"] = comments
    env.setdefault("warehouse_inventories", {})[inventory_id] = item
    return f"Inventory item {inventory_id} added (SKU: {sku})."


def adjust_warehouse_quantity(env, inventory_id, adjustment) -> str:
    items = env.get("warehouse_inventories", {})
    if inventory_id not in items:
        return f"Error: Inventory item {inventory_id} not found."
    items[inventory_id]["quantity"] = items[inventory_id].get("quantity", 0) + adjustment
    return f"Inventory {inventory_id} quantity adjusted by {adjustment}."


SHARED: tuple[str, ...] = ()

TOOLS: dict[str, Handler] = {
    "get_carrier_messages": get_carrier_messages,
    "send_carrier_message": send_carrier_message,
    "get_customs_declaration_by_shipment": get_customs_declaration_by_shipment,
    "submit_customs_declaration": submit_customs_declaration,
    "get_delivery_schedule": get_delivery_schedule,
    "get_shipment_by_id": get_shipment_by_id,
    "search_shipments_by_status": search_shipments_by_status,
    "update_shipment_status": update_shipment_status,
    "get_warehouse_inventory_item": get_warehouse_inventory_item,
    "list_low_stock_items": list_low_stock_items,
    "add_warehouse_inventory": add_warehouse_inventory,
    "adjust_warehouse_quantity": adjust_warehouse_quantity,
}
