"""Customer relationship manager toolkit over the session's ``_crm_data``.

Searches match the text fields as case-insensitive regular expressions and bound the two dates by
comparing strings; pages out of range are clamped. ``add_customer`` takes its ``status`` as given
(only ``update_customer`` checks statuses and products) and stores ``notes`` as ``""`` when none are
given; ``update_customer`` may change any column, ``customer_id`` included.
"""

from __future__ import annotations

from typing import ClassVar

import pandas as pd

from ..environment import CRM
from ._common import SessionTable, Toolkit, page_of, paginated

STATUSES = ["Qualified", "Won", "Lost", "Lead", "Proposal"]
PRODUCTS = ["Software", "Hardware", "Services", "Consulting", "Training"]
TEXT_FILTERS = ["customer_name", "customer_email", "product_interest", "status", "assigned_to_email"]
#: (argument, column, keep rows whose value is >= the bound (True) or <= it (False))
DATE_FILTERS = [
    ("last_contact_date_min", "last_contact_date", True),
    ("last_contact_date_max", "last_contact_date", False),
    ("follow_up_by_min", "follow_up_by", True),
    ("follow_up_by_max", "follow_up_by", False),
]


def _choices(values: list[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


class CustomerRelationshipManagerTool(Toolkit):
    TOOLS: ClassVar[dict[str, str]] = {
        "customer_relationship_manager_search_customers": "search_customers",
        "customer_relationship_manager_update_customer": "update_customer",
        "customer_relationship_manager_add_customer": "add_customer",
        "customer_relationship_manager_delete_customer": "delete_customer",
    }

    _crm_data = SessionTable(CRM)

    def search_customers(
        self,
        customer_name=None,
        customer_email=None,
        product_interest=None,
        status=None,
        assigned_to_email=None,
        last_contact_date_min=None,
        last_contact_date_max=None,
        follow_up_by_min=None,
        follow_up_by_max=None,
        page=1,
        page_size=5,
    ):
        given = {
            "customer_name": customer_name,
            "customer_email": customer_email,
            "product_interest": product_interest,
            "status": status,
            "assigned_to_email": assigned_to_email,
            "last_contact_date_min": last_contact_date_min,
            "last_contact_date_max": last_contact_date_max,
            "follow_up_by_min": follow_up_by_min,
            "follow_up_by_max": follow_up_by_max,
        }
        customers = self._crm_data.copy()
        if not any(given.values()):
            return "No search parameters provided. Please provide at least one parameter."
        for column in TEXT_FILTERS:
            if given[column]:
                customers = customers[customers[column].str.contains(given[column], case=False)]
        for argument, column, lower_bound in DATE_FILTERS:
            bound = given[argument]
            if bound:
                values = customers[column]
                customers = customers[values >= bound] if lower_bound else customers[values <= bound]
        found = customers.to_dict(orient="records")
        info = page_of(len(found), page, page_size)
        if not found:
            return "No customers found."
        return paginated("customers", found, info)

    def update_customer(self, customer_id=None, field=None, new_value=None):
        if not customer_id or not field or not new_value:
            return "Customer ID, field, or new value not provided."
        if field == "status" and new_value not in STATUSES:
            return f"Status not valid. Please choose from: {_choices(STATUSES)}"
        if field == "product_interest" and new_value not in PRODUCTS:
            return f"Product interest not valid. Please choose from: {_choices(PRODUCTS)}"
        if field in ["customer_email", "assigned_to_email"]:
            new_value = new_value.lower()
        table = self._crm_data
        if customer_id not in table["customer_id"].values:
            return "Customer not found."
        if field not in table.columns:
            columns = [
                "customer_name",
                "assigned_to_email",
                "customer_email",
                "customer_phone",
                "last_contact_date",
                "product_interest",
                "status",
                "notes",
                "follow_up_by",
            ]
            return f"Field not valid. Please choose from: {_choices(columns)}"
        table.loc[table["customer_id"] == customer_id, field] = new_value
        return "Customer updated successfully."

    def add_customer(
        self,
        customer_name=None,
        assigned_to_email=None,
        status=None,
        customer_email=None,
        customer_phone=None,
        last_contact_date=None,
        product_interest=None,
        notes="",
        follow_up_by=None,
    ):
        if not all([customer_name, assigned_to_email, status]):
            return "Please provide all required fields: customer_name, assigned_to_email, status."
        assigned_to_email = assigned_to_email.lower()
        if customer_email:
            customer_email = customer_email.lower()
        table = self._crm_data
        new_id = str(int(table["customer_id"].max()) + 1).zfill(8)
        row = pd.DataFrame(
            {
                "customer_id": [new_id],
                "customer_name": [customer_name],
                "customer_email": [customer_email],
                "customer_phone": [customer_phone],
                "last_contact_date": [last_contact_date],
                "product_interest": [product_interest],
                "status": [status],
                "assigned_to_email": [assigned_to_email],
                "notes": [notes],
                "follow_up_by": [follow_up_by],
            }
        )
        self._crm_data = pd.concat([table, row], ignore_index=True)
        return new_id

    def delete_customer(self, customer_id=None):
        if not customer_id:
            return "Customer ID not provided."
        table = self._crm_data
        if customer_id not in table["customer_id"].values:
            return "Customer not found."
        self._crm_data = table[table["customer_id"] != customer_id]
        return "Customer deleted successfully."
