"""Email toolkit: read, search, send, delete, forward and reply over the session's ``_emails``.

New emails get the largest ``email_id`` (compared as text) plus one, written without zero padding
("500" after "00000499"), and land under a fresh 0..n-1 index. Forward and reply go through
:meth:`EmailTool.send_email`, so their subjects are "FW: ..." and "RE: ...".
"""

from __future__ import annotations

from typing import ClassVar

import pandas as pd

from ..environment import EMAILS
from ._common import NOW, SessionTable, Toolkit, page_of, paginated


class EmailTool(Toolkit):
    TOOLS: ClassVar[dict[str, str]] = {
        "email_get_email_information_by_id": "get_email_information_by_id",
        "email_search_emails": "search_emails",
        "email_send_email": "send_email",
        "email_delete_email": "delete_email",
        "email_forward_email": "forward_email",
        "email_reply_email": "reply_email",
    }

    _emails = SessionTable(EMAILS)

    def _rows_with_id(self, email_id) -> list[dict]:
        table = self._emails
        return table[table["email_id"] == email_id].to_dict(orient="records")

    def get_email_information_by_id(self, email_id=None, field=None):
        if not email_id:
            return "Email ID not provided."
        if not field:
            return "Field not provided."
        try:
            found = self._rows_with_id(email_id)
            if not found:
                return "Email not found."
            record = found[0]
            if field not in record:
                return f"Field '{field}' not found. Available fields: {', '.join(record.keys())}"
            return {field: record[field]}
        except Exception as exc:
            return f"Error retrieving email information: {exc}"

    def search_emails(self, query="", date_min=None, date_max=None, page=1, page_size=5):
        try:
            return self._search(query, date_min, date_max, page, page_size)
        except Exception as exc:
            return f"Error searching emails: {exc}"

    def _search(self, query, date_min, date_max, page, page_size):
        words = query.lower().split()

        def matches(row) -> bool:
            text = f"{row['subject']} {row['body']} {row['sender/recipient']}".lower()
            return all(word in text for word in words)

        table = self._emails
        hits = table[table.apply(matches, axis=1)].copy()
        hits["_sent"] = pd.to_datetime(hits["sent_datetime"])
        hits = hits.sort_values("_sent", ascending=False).drop(columns=["_sent"])
        found = hits.to_dict(orient="records")

        def day(value):
            return pd.Timestamp(value).date()

        if date_min:
            found = [e for e in found if day(e["sent_datetime"]) >= day(date_min)]
        if date_max:  # inclusive: whole days are compared
            found = [e for e in found if day(e["sent_datetime"]) <= day(date_max)]
        info = page_of(len(found), page, page_size)
        if not found:
            return "No emails found."
        return paginated("emails", found, info)

    def send_email(self, recipient=None, subject=None, body=None):
        if not recipient or not subject or not body:
            return "Recipient, subject, or body not provided."
        if "@" not in recipient or "." not in recipient:
            return "Invalid recipient email address."
        try:
            recipient = recipient.lower()
            table = self._emails
            new_id = "1" if table.empty else str(int(table["email_id"].max()) + 1)
            row = {
                "email_id": new_id,
                "inbox/outbox": "outbox",
                "sender/recipient": recipient,
                "subject": subject,
                "sent_datetime": NOW,
                "body": body,
            }
            self._emails = pd.concat([table, pd.DataFrame([row])], ignore_index=True)
            return "Email sent successfully."
        except Exception as exc:
            return f"Error sending email: {exc}"

    def delete_email(self, email_id=None):
        if not email_id:
            return "Email ID not provided."
        try:
            table = self._emails
            if email_id not in table["email_id"].values:
                return "Email not found."
            self._emails = table[table["email_id"] != email_id]
            return "Email deleted successfully."
        except Exception as exc:
            return f"Error deleting email: {exc}"

    def _send_about(self, email_id, recipient, subject_prefix: str, body, done: str):
        """Shared tail of forward and reply: send a new email built from ``email_id``'s row."""
        original = self._rows_with_id(email_id)[0]
        if recipient is None:  # reply: back to whoever the original was with
            recipient = original["sender/recipient"]
        if body is None:  # forward: the original text
            body = original["body"]
        answer = self.send_email(recipient, f"{subject_prefix}{original['subject']}", body)
        if "Error" in answer or "Invalid" in answer:
            return answer
        return done

    def forward_email(self, email_id=None, recipient=None):
        if not email_id or not recipient:
            return "Email ID or recipient not provided."
        if "@" not in recipient or "." not in recipient:
            return "Invalid recipient email address."
        try:
            if email_id not in self._emails["email_id"].values:
                return "Email not found."
            recipient = recipient.lower()
            return self._send_about(email_id, recipient, "FW: ", None, "Email forwarded successfully.")
        except Exception as exc:
            return f"Error forwarding email: {exc}"

    def reply_email(self, email_id=None, body=None):
        if not email_id or not body:
            return "Email ID or body not provided."
        try:
            if email_id not in self._emails["email_id"].values:
                return "Email not found."
            return self._send_about(email_id, None, "RE: ", body, "Email replied successfully.")
        except Exception as exc:
            return f"Error replying to email: {exc}"
