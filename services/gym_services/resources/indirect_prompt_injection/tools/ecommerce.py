"""E-commerce: orders, the product catalogue, refunds, support tickets.

Environment: ``orders``, ``products``, ``refunds``, ``support_tickets`` (dicts keyed by ID, each may
be absent), ``current_user``. New tickets get ``T-`` and six hex digits; a refund ID that does not
exist yet is created by processing it.
"""

from __future__ import annotations

from typing import Any

from gym_services.resources.indirect_prompt_injection.state import new_id
from gym_services.resources.indirect_prompt_injection.tools.common import (
    Handler,
    appended_text,
    lookup,
    same_text,
    text_contains,
)


def search_orders(env, customer_id=None, status=None, **kwargs) -> list[Any]:
    """Orders of one customer and/or in one status (case-insensitive); all orders without filters."""
    hits = []
    for order in env.get("orders", {}).values():
        if customer_id and order.get("customer_id") != customer_id:
            continue
        if status and not same_text(order, "status", status):
            continue
        hits.append(order)
    return hits


def get_order_details(env, order_id) -> Any:
    return lookup(env.get("orders", {}), order_id, {"error": f"Order {order_id} not found."})


def update_order_status(env, order_id, status) -> str:
    orders = env.get("orders", {})
    if order_id not in orders:
        return f"Error: Order {order_id} not found."
    orders[order_id]["status"] = status
    return f"Order {order_id} status updated to '{status}'."


def add_order_note(env, order_id, note) -> str:
    orders = env.get("orders", {})
    if order_id not in orders:
        return f"Error: Order {order_id} not found."
    order = orders[order_id]
    order["notes"] = appended_text(order.get("notes", ""), note)
    return f"Note added to order {order_id}."


def search_products(env, query=None, category=None, **kwargs) -> list[Any]:
    """Products in a category and/or whose name or description contains ``query``."""
    hits = []
    for product in env.get("products", {}).values():
        if category and not same_text(product, "category", category):
            continue
        if query:
            needle = query.lower()
            by_name = text_contains(needle, product, "name")
            by_description = text_contains(needle, product, "description")
            if not (by_name or by_description):
                continue
        hits.append(product)
    return hits


def get_product_details(env, product_id) -> Any:
    return lookup(env.get("products", {}), product_id, {"error": f"Product {product_id} not found."})


def update_product_stock(env, product_id, stock_quantity) -> str:
    products = env.get("products", {})
    if product_id not in products:
        return f"Error: Product {product_id} not found."
    products[product_id]["stock_quantity"] = stock_quantity
    return f"Stock updated for product {product_id} to {stock_quantity}."


def process_refund(env, refund_id, amount, reason=None, admin_notes=None) -> str:
    """Mark a refund processed with this amount; an unknown refund ID is recorded as a new refund."""
    refunds = env.get("refunds", {})
    if refund_id in refunds:
        refund = refunds[refund_id]
        refund["status"] = "processed"
        refund["amount"] = amount
    else:
        refund = {"refund_id": refund_id, "amount": amount, "status": "processed"}
    if reason:
        refund["reason"] = reason
    if admin_notes:
        refund["admin_notes"] = admin_notes
    if refund_id not in refunds:
        env.setdefault("refunds", {})[refund_id] = refund
    return f"Refund {refund_id} processed for ${amount}."


def create_support_ticket(env, customer_id, subject, description, order_id=None, priority="medium") -> str:
    ticket_id = new_id("T-")
    ticket = {
        "ticket_id": ticket_id,
        "customer_id": customer_id,
        "subject": subject,
        "description": description,
        "status": "open",
        "priority": priority,
    }
    if order_id:
        ticket["order_id"] = order_id
    env.setdefault("support_tickets", {})[ticket_id] = ticket
    return f"Support ticket {ticket_id} created."


def get_ticket_details(env, ticket_id) -> Any:
    return lookup(env.get("support_tickets", {}), ticket_id, {"error": f"Ticket {ticket_id} not found."})


def update_ticket_status(env, ticket_id, status, priority=None) -> str:
    tickets = env.get("support_tickets", {})
    if ticket_id not in tickets:
        return f"Error: Ticket {ticket_id} not found."
    tickets[ticket_id]["status"] = status
    if priority:
        tickets[ticket_id]["priority"] = priority
    return f"Ticket {ticket_id} updated to status '{status}'."


SHARED: tuple[str, ...] = ()

TOOLS: dict[str, Handler] = {
    "search_orders": search_orders,
    "get_order_details": get_order_details,
    "update_order_status": update_order_status,
    "add_order_note": add_order_note,
    "search_products": search_products,
    "get_product_details": get_product_details,
    "update_product_stock": update_product_stock,
    "process_refund": process_refund,
    "create_support_ticket": create_support_ticket,
    "get_ticket_details": get_ticket_details,
    "update_ticket_status": update_ticket_status,
}
