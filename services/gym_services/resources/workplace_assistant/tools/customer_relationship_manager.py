"""Customer relationship manager toolkit: search, update, add and delete ``_crm_data`` records.

``add_customer`` stores ``None`` for optional fields that were not given, so CRM cells hold both
NaN (empty in the CSV) and ``None`` (left empty by a tool) -- the distinction the codec keeps.
"""

from __future__ import annotations

import numpy as np

from ..environment import CRM, WorkplaceEnvironment
from ._common import (
    append_row,
    choice_error,
    contains_ci,
    delete_by_id,
    match_mask,
    next_id,
    next_label,
    paginate,
    parse_date,
    records,
)

STATUSES = ("Qualified", "Won", "Lost", "Lead", "Proposal")
PRODUCT_INTERESTS = ("Software", "Hardware", "Services", "Consulting", "Training")
UPDATABLE_FIELDS = (
    "customer_name",
    "assigned_to_email",
    "customer_email",
    "customer_phone",
    "last_contact_date",
    "product_interest",
    "status",
    "notes",
    "follow_up_by",
)
_LOWERCASED = ("customer_email", "assigned_to_email")


def _day_mask(values: np.ndarray, lo: str | None, hi: str | None) -> np.ndarray:
    """Rows whose date (first 10 characters, ``YYYY-MM-DD``) lies in [lo, hi]; empty never does."""
    out = np.empty(len(values), dtype=bool)
    for i, v in enumerate(values):
        day = v[:10] if isinstance(v, str) else None
        out[i] = day is not None and (lo is None or day >= lo) and (hi is None or day <= hi)
    return out


def customer_relationship_manager_search_customers(
    env: WorkplaceEnvironment,
    customer_name: str | None = None,
    customer_email: str | None = None,
    product_interest: str | None = None,
    status: str | None = None,
    assigned_to_email: str | None = None,
    last_contact_date_min: str | None = None,
    last_contact_date_max: str | None = None,
    follow_up_by_min: str | None = None,
    follow_up_by_max: str | None = None,
    page: int = 1,
    page_size: int = 5,
) -> object:
    """Customers matching every given parameter (text: case-insensitive substring; dates:
    inclusive day bounds), in table order, one page at a time."""
    text = {
        "customer_name": customer_name,
        "customer_email": customer_email,
        "product_interest": product_interest,
        "status": status,
        "assigned_to_email": assigned_to_email,
    }
    dates = {
        "last_contact_date": (last_contact_date_min, last_contact_date_max),
        "follow_up_by": (follow_up_by_min, follow_up_by_max),
    }
    if not any(text.values()) and not any(v for pair in dates.values() for v in pair):
        return "No search parameters provided. Please provide at least one parameter."
    crm = env.get(CRM)
    keep = np.ones(len(crm), dtype=bool)
    for column, value in text.items():
        if value:
            keep &= contains_ci(crm[column], value)
    for column, (lo, hi) in dates.items():
        if lo or hi:
            lo = parse_date(lo, f"{column}_min") if lo else None
            hi = parse_date(hi, f"{column}_max") if hi else None
            keep &= _day_mask(crm[column].to_numpy(), lo, hi)
    found = crm[keep]
    if found.empty:
        return "No customers found."
    return paginate(records(found), page, page_size, "customers")


def customer_relationship_manager_update_customer(
    env: WorkplaceEnvironment,
    customer_id: str | None = None,
    field: str | None = None,
    new_value: str | None = None,
) -> object:
    if not customer_id or not field or not new_value:
        return "Customer ID, field, or new value not provided."
    if field not in UPDATABLE_FIELDS:
        options = ", ".join(f"'{f}'" for f in UPDATABLE_FIELDS)
        return f"Field not valid. Please choose from: {options}."
    problem = None
    if field == "status":
        problem = choice_error(new_value, STATUSES, "Status")
    elif field == "product_interest":
        problem = choice_error(new_value, PRODUCT_INTERESTS, "Product interest")
    if problem:
        return problem
    if field in _LOWERCASED:
        new_value = new_value.lower()
    crm = env.get(CRM)
    hit = match_mask(crm, "customer_id", customer_id)
    if not hit.any():
        return "Customer not found."
    crm.loc[hit, field] = new_value
    return "Customer updated successfully."


def customer_relationship_manager_add_customer(
    env: WorkplaceEnvironment,
    customer_name: str | None = None,
    assigned_to_email: str | None = None,
    status: str | None = None,
    customer_email: str | None = None,
    customer_phone: str | None = None,
    last_contact_date: str | None = None,
    product_interest: str | None = None,
    notes: str | None = None,
    follow_up_by: str | None = None,
) -> object:
    if not customer_name or not assigned_to_email or not status:
        return "Please provide all required fields: customer_name, assigned_to_email, status."
    problem = choice_error(status, STATUSES, "Status")
    if product_interest and not problem:
        problem = choice_error(product_interest, PRODUCT_INTERESTS, "Product interest")
    if problem:
        return problem
    crm = env.get(CRM)
    customer_id = next_id(crm, "customer_id")
    row = {
        "customer_id": customer_id,
        "assigned_to_email": assigned_to_email.lower(),
        "customer_name": customer_name,
        "customer_email": customer_email.lower() if customer_email else customer_email,
        "customer_phone": customer_phone,
        "last_contact_date": last_contact_date,
        "product_interest": product_interest,
        "status": status,
        "follow_up_by": follow_up_by,
        "notes": notes,
    }
    env.put(CRM, append_row(crm, next_label(crm), row))
    return customer_id


def customer_relationship_manager_delete_customer(
    env: WorkplaceEnvironment, customer_id: str | None = None
) -> object:
    return delete_by_id(env, CRM, "customer_id", customer_id, "Customer")


TOOLS = {
    "customer_relationship_manager_search_customers": customer_relationship_manager_search_customers,
    "customer_relationship_manager_update_customer": customer_relationship_manager_update_customer,
    "customer_relationship_manager_add_customer": customer_relationship_manager_add_customer,
    "customer_relationship_manager_delete_customer": customer_relationship_manager_delete_customer,
}
