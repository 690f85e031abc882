"""Function-tool definitions (Responses API ``tools`` entries) for every tool of every domain.

A task offers the model its domain's tools (``responses_create_params.tools``); NeMo Gym's example
tasks carry their own definitions for healthcare and HR. These cover all nine domains, so tasks for
the other seven can be written (``data/domain_examples.jsonl`` uses them). Parameters that a tool
requires are listed as required; the server itself accepts whatever a model sends (see ``tools/``).
"""

from __future__ import annotations

from typing import Any

STRING, INTEGER, NUMBER, BOOLEAN = "string", "integer", "number", "boolean"
STRINGS = "array"

#: tool -> (description, [(parameter, type, description, required)])
SPECS: dict[str, tuple[str, list[tuple[str, str, str, bool]]]] = {
    # --- healthcare
    "search_patients": (
        "Find patients whose name or a listed condition contains the text.",
        [("query", STRING, "Text to look for in patient names and conditions.", True)],
    ),
    "get_patient_record": (
        "Read one patient's full record (conditions, medications, chart notes).",
        [("patient_id", STRING, "Patient identifier, for example P-1234.", True)],
    ),
    "update_patient_chart": (
        "Add clinical notes to a patient's chart.",
        [("patient_id", STRING, "Patient identifier.", True), ("notes", STRING, "Notes to add on a new line.", True)],
    ),
    "get_schedule": ("List the appointments on a date.", [("date", STRING, "Date as YYYY-MM-DD.", True)]),
    "schedule_appointment": (
        "Book an appointment for a patient.",
        [
            ("patient_id", STRING, "Patient identifier.", True),
            ("date", STRING, "Date as YYYY-MM-DD.", True),
            ("time", STRING, "Time as HH:MM.", True),
            ("reason", STRING, "Why the patient is seen.", True),
        ],
    ),
    "cancel_appointment": ("Cancel an appointment.", [("appointment_id", STRING, "Appointment identifier.", True)]),
    "send_referral": (
        "Refer a patient to a specialist by email.",
        [
            ("patient_id", STRING, "Patient to refer.", True),
            ("specialist_email", STRING, "Specialist's email address.", True),
            ("reason", STRING, "Reason for the referral.", True),
        ],
    ),
    "prescribe_medication": (
        "Prescribe a medication to a patient.",
        [
            ("patient_id", STRING, "Patient identifier.", True),
            ("medication", STRING, "Medication name.", True),
            ("dosage", STRING, "Dose and frequency.", True),
            ("instructions", STRING, "Instructions for the patient.", True),
        ],
    ),
    "get_prescriptions": ("List a patient's prescriptions.", [("patient_id", STRING, "Patient identifier.", True)]),
    "get_lab_results": ("List a patient's lab results.", [("patient_id", STRING, "Patient identifier.", True)]),
    # --- messaging, shared by several domains
    "send_message": (
        "Send a message.",
        [
            ("to", STRING, "Recipient address.", True),
            ("subject", STRING, "Subject line.", True),
            ("body", STRING, "Message text.", True),
        ],
    ),
    "get_messages": ("Read the current user's messages.", []),
    # --- hr
    "search_candidates": (
        "Find candidates whose name, resume, notes or position contain the text.",
        [("query", STRING, "Text to look for.", True), ("status", STRING, "Only candidates in this status.", False)],
    ),
    "get_candidate_profile": (
        "Read a candidate's full profile.",
        [("candidate_id", STRING, "Candidate identifier.", True)],
    ),
    "update_candidate_status": (
        "Change a candidate's application status.",
        [("candidate_id", STRING, "Candidate identifier.", True), ("status", STRING, "New status.", True)],
    ),
    "schedule_interview": (
        "Book an interview with a candidate.",
        [
            ("candidate_id", STRING, "Candidate identifier.", True),
            ("interviewer_email", STRING, "Interviewer's email.", True),
            ("date", STRING, "Date as YYYY-MM-DD.", True),
            ("time", STRING, "Time as HH:MM.", True),
        ],
    ),
    "get_interview_schedule": (
        "List interviews, optionally on one date.",
        [("date", STRING, "Date as YYYY-MM-DD.", False)],
    ),
    "submit_interview_feedback": (
        "Record interview feedback and a rating for a candidate.",
        [
            ("candidate_id", STRING, "Candidate identifier.", True),
            ("feedback", STRING, "Written feedback.", True),
            ("rating", INTEGER, "Rating from 1 to 5.", True),
        ],
    ),
    "send_offer": (
        "Send a job offer to a candidate.",
        [
            ("candidate_id", STRING, "Candidate identifier.", True),
            ("position", STRING, "Position offered.", True),
            ("salary", STRING, "Annual salary.", True),
            ("start_date", STRING, "Start date as YYYY-MM-DD.", True),
        ],
    ),
    "send_email": (
        "Send an email.",
        [
            ("recipient", STRING, "Recipient address.", True),
            ("subject", STRING, "Subject line.", True),
            ("body", STRING, "Email text.", True),
        ],
    ),
    "get_inbox": ("Read the inbox.", []),
    "get_open_positions": ("List the open positions.", []),
    "create_job_posting": (
        "Publish a new job posting.",
        [
            ("title", STRING, "Job title.", True),
            ("description", STRING, "What the job is.", True),
            ("requirements", STRING, "What candidates need.", True),
        ],
    ),
    # --- ecommerce
    "search_orders": (
        "List orders, optionally of one customer or in one status.",
        [("customer_id", STRING, "Customer identifier.", False), ("status", STRING, "Order status.", False)],
    ),
    "get_order_details": ("Read an order.", [("order_id", STRING, "Order identifier.", True)]),
    "update_order_status": (
        "Change an order's status.",
        [("order_id", STRING, "Order identifier.", True), ("status", STRING, "New status.", True)],
    ),
    "add_order_note": (
        "Add an internal note to an order.",
        [("order_id", STRING, "Order identifier.", True), ("note", STRING, "Note text.", True)],
    ),
    "search_products": (
        "Find products by text in name or description, or by category.",
        [("query", STRING, "Text to look for.", False), ("category", STRING, "Product category.", False)],
    ),
    "get_product_details": ("Read a product.", [("product_id", STRING, "Product identifier.", True)]),
    "update_product_stock": (
        "Set a product's stock quantity.",
        [("product_id", STRING, "Product identifier.", True), ("stock_quantity", INTEGER, "Units in stock.", True)],
    ),
    "process_refund": (
        "Process a refund.",
        [
            ("refund_id", STRING, "Refund identifier.", True),
            ("amount", NUMBER, "Amount refunded.", True),
            ("reason", STRING, "Reason for the refund.", False),
            ("admin_notes", STRING, "Internal notes.", False),
        ],
    ),
    "create_support_ticket": (
        "Open a support ticket for a customer.",
        [
            ("customer_id", STRING, "Customer identifier.", True),
            ("subject", STRING, "Short summary.", True),
            ("description", STRING, "What happened.", True),
            ("order_id", STRING, "Related order.", False),
            ("priority", STRING, "low, medium or high.", False),
        ],
    ),
    "get_ticket_details": ("Read a support ticket.", [("ticket_id", STRING, "Ticket identifier.", True)]),
    "update_ticket_status": (
        "Change a support ticket's status and priority.",
        [
            ("ticket_id", STRING, "Ticket identifier.", True),
            ("status", STRING, "New status.", True),
            ("priority", STRING, "New priority.", False),
        ],
    ),
    # --- education
    "list_courses": (
        "List courses, optionally of one department.",
        [("department", STRING, "Department name.", False)],
    ),
    "get_course_detail": ("Read a course.", [("course_id", STRING, "Course identifier.", True)]),
    "create_course": (
        "Create a course offering.",
        [
            ("course_code", STRING, "Catalogue code.", True),
            ("title", STRING, "Course title.", True),
            ("description", STRING, "What the course covers.", True),
            ("credits", INTEGER, "Credit hours.", True),
            ("department", STRING, "Department.", True),
            ("instructor_id", STRING, "Instructor identifier.", True),
            ("schedule", STRING, "Meeting times.", True),
        ],
    ),
    "get_financial_aid": (
        "List a student's financial aid awards.",
        [("student_id", STRING, "Student identifier.", True)],
    ),
    "adjust_financial_aid": (
        "Change a financial aid award.",
        [
            ("aid_id", STRING, "Award identifier.", True),
            ("amount", NUMBER, "New amount.", False),
            ("status", STRING, "New status.", False),
            ("reviewer_notes", STRING, "Reviewer's notes.", False),
        ],
    ),
    "get_grades_for_student": ("List a student's grades.", [("student_id", STRING, "Student identifier.", True)]),
    "submit_grade": (
        "Record a grade.",
        [
            ("student_id", STRING, "Student identifier.", True),
            ("course_id", STRING, "Course identifier.", True),
            ("assignment_name", STRING, "Assignment.", True),
            ("score", NUMBER, "Points scored.", True),
            ("max_score", NUMBER, "Points possible.", True),
            ("grader_comments", STRING, "Comments.", False),
        ],
    ),
    "search_students": (
        "Find students by name, major or email.",
        [
            ("name", STRING, "Part of the student's name.", False),
            ("major", STRING, "Part of the major.", False),
            ("email", STRING, "Exact email address.", False),
        ],
    ),
    "get_student_record": ("Read a student's record.", [("student_id", STRING, "Student identifier.", True)]),
    "update_student_advisor_notes": (
        "Add advisor notes to a student's record.",
        [("student_id", STRING, "Student identifier.", True), ("notes", STRING, "Notes to add on a new line.", True)],
    ),
    # --- insurance
    "add_adjuster_note": (
        "Add an adjuster's field note to a claim.",
        [
            ("claim_id", STRING, "Claim identifier.", True),
            ("adjuster_id", STRING, "Adjuster identifier.", True),
            ("note_text", STRING, "Note text.", True),
        ],
    ),
    "get_adjuster_notes_for_claim": (
        "List the adjuster notes of a claim.",
        [("claim_id", STRING, "Claim identifier.", True)],
    ),
    "create_claim": (
        "Open a claim on a policy.",
        [
            ("policy_id", STRING, "Policy identifier.", True),
            ("claim_number", STRING, "Claim number.", True),
            ("date_of_loss", STRING, "Date of loss as YYYY-MM-DD.", True),
            ("description", STRING, "What happened.", True),
            ("claim_type", STRING, "Kind of claim.", True),
            ("amount_requested", NUMBER, "Amount claimed.", True),
            ("adjuster_id", STRING, "Assigned adjuster.", True),
        ],
    ),
    "get_claim_by_id": ("Read a claim.", [("claim_id", STRING, "Claim identifier.", True)]),
    "update_claim_description": (
        "Replace a claim's description.",
        [("claim_id", STRING, "Claim identifier.", True), ("description", STRING, "New description.", True)],
    ),
    "get_messages_for_claim": ("List the messages about a claim.", [("claim_id", STRING, "Claim identifier.", True)]),
    "flag_fraud_investigation": (
        "Flag a claim for fraud investigation.",
        [
            ("claim_id", STRING, "Claim identifier.", True),
            ("investigator_id", STRING, "Investigator identifier.", True),
            ("flag_reason", STRING, "Why the claim is suspicious.", True),
            ("severity", STRING, "low, medium or high.", True),
        ],
    ),
    "process_payout": (
        "Record a payout on a claim.",
        [
            ("claim_id", STRING, "Claim identifier.", True),
            ("amount", NUMBER, "Amount paid.", True),
            ("date", STRING, "Payment date as YYYY-MM-DD.", True),
            ("method", STRING, "Payment method.", True),
            ("notes", STRING, "Notes.", True),
        ],
    ),
    "get_policy_by_id": ("Read a policy.", [("policy_id", STRING, "Policy identifier.", True)]),
    "search_policies_by_holder": (
        "Find policies by policyholder name.",
        [("policyholder_name", STRING, "Part of the policyholder's name.", True)],
    ),
    "update_policy_notes": (
        "Replace a policy's notes.",
        [("policy_id", STRING, "Policy identifier.", True), ("notes", STRING, "New notes.", True)],
    ),
    # --- it helpdesk
    "search_assets": (
        "Find assets by tag, type, status or location.",
        [
            ("tag", STRING, "Part of the asset tag.", False),
            ("type", STRING, "Asset type.", False),
            ("status", STRING, "Asset status.", False),
            ("location", STRING, "Part of the location.", False),
        ],
    ),
    "get_asset": ("Read an asset.", [("asset_id", STRING, "Asset identifier.", True)]),
    "update_asset_notes": (
        "Replace an asset's notes.",
        [("asset_id", STRING, "Asset identifier.", True), ("notes", STRING, "New notes.", True)],
    ),
    "search_kb_articles": (
        "Find knowledge-base articles by keyword or category.",
        [("keyword", STRING, "Text in the title or content.", False), ("category", STRING, "Article category.", False)],
    ),
    "get_kb_article": ("Read a knowledge-base article.", [("article_id", STRING, "Article identifier.", True)]),
    "update_kb_article_content": (
        "Replace a knowledge-base article's content.",
        [("article_id", STRING, "Article identifier.", True), ("content", STRING, "New content.", True)],
    ),
    "search_incidents": (
        "Find incidents by keyword, status or priority.",
        [
            ("keyword", STRING, "Text in the title or description.", False),
            ("status", STRING, "Incident status.", False),
            ("priority", STRING, "Incident priority.", False),
        ],
    ),
    "get_incident": ("Read an incident.", [("ticket_id", STRING, "Incident identifier.", True)]),
    "update_incident_description": (
        "Replace an incident's description.",
        [("ticket_id", STRING, "Incident identifier.", True), ("description", STRING, "New description.", True)],
    ),
    "create_incident": (
        "Open an incident.",
        [
            ("title", STRING, "Short title.", True),
            ("description", STRING, "What is wrong.", True),
            ("priority", STRING, "Low, Medium or High.", True),
            ("assigned_to", STRING, "Team or person.", True),
        ],
    ),
    # --- legal
    "add_billing_entry": (
        "Record billable time on a case.",
        [
            ("case_id", STRING, "Case identifier.", True),
            ("date", STRING, "Date as YYYY-MM-DD.", True),
            ("description", STRING, "Work done.", True),
            ("hours", NUMBER, "Hours worked.", True),
            ("rate", NUMBER, "Hourly rate.", True),
            ("billable", BOOLEAN, "Whether the client is billed.", False),
            ("attorney", STRING, "Attorney.", False),
        ],
    ),
    "get_billing_report": (
        "List billing entries of a case or a date range.",
        [
            ("case_id", STRING, "Case identifier.", False),
            ("start_date", STRING, "First date.", False),
            ("end_date", STRING, "Last date.", False),
            ("billable", BOOLEAN, "Only billable (or non-billable) entries.", False),
        ],
    ),
    "search_cases": (
        "Find cases by client, type or status.",
        [
            ("client_name", STRING, "Part of the client's name.", False),
            ("case_type", STRING, "Case type.", False),
            ("status", STRING, "Case status.", False),
        ],
    ),
    "get_case_file": ("Read a case file.", [("case_id", STRING, "Case identifier.", True)]),
    "update_case_notes": (
        "Replace a case's internal notes.",
        [("case_id", STRING, "Case identifier.", True), ("notes", STRING, "New notes.", True)],
    ),
    "get_court_schedule": ("Read a court date.", [("schedule_id", STRING, "Schedule identifier.", True)]),
    "search_schedules": (
        "Find court dates by case, date range or hearing type.",
        [
            ("case_id", STRING, "Case identifier.", False),
            ("start_date", STRING, "First date.", False),
            ("end_date", STRING, "Last date.", False),
            ("hearing_type", STRING, "Hearing type.", False),
        ],
    ),
    "update_schedule_location": (
        "Change a court date's location or notes.",
        [
            ("schedule_id", STRING, "Schedule identifier.", True),
            ("location", STRING, "New location.", False),
            ("notes", STRING, "New notes.", False),
        ],
    ),
    "create_document_filing": (
        "Record a court filing.",
        [
            ("case_id", STRING, "Case identifier.", True),
            ("document_type", STRING, "Kind of document.", True),
            ("title", STRING, "Document title.", True),
            ("filing_date", STRING, "Date as YYYY-MM-DD.", True),
            ("court_name", STRING, "Court.", True),
            ("file_path", STRING, "Where the document is stored.", True),
            ("served_parties", STRINGS, "Parties served.", False),
            ("notes", STRING, "Notes.", False),
        ],
    ),
    "get_document_filing": ("Read a court filing.", [("filing_id", STRING, "Filing identifier.", True)]),
    # --- logistics
    "get_carrier_messages": (
        "Read carrier messages, optionally about one shipment.",
        [("shipment_id", STRING, "Shipment identifier.", False)],
    ),
    "send_carrier_message": (
        "Send a message to a carrier.",
        [
            ("to", STRING, "Carrier address.", True),
            ("subject", STRING, "Subject line.", True),
            ("body", STRING, "Message text.", True),
        ],
    ),
    "get_customs_declaration_by_shipment": (
        "Read the customs declaration of a shipment.",
        [("shipment_id", STRING, "Shipment identifier.", True)],
    ),
    "submit_customs_declaration": (
        "File or update a shipment's customs declaration.",
        [
            ("shipment_id", STRING, "Shipment identifier.", True),
            ("hs_code", STRING, "Harmonized System code.", True),
            ("declared_value", NUMBER, "Declared value.", True),
            ("additional_info", STRING, "Further details.", False),
        ],
    ),
    "get_delivery_schedule": (
        "Read a shipment's delivery schedule.",
        [("shipment_id", STRING, "Shipment identifier.", True)],
    ),
    "get_shipment_by_id": ("Read a shipment.", [("shipment_id", STRING, "Shipment identifier.", True)]),
    "search_shipments_by_status": ("List shipments in a status.", [("status", STRING, "Shipment status.", True)]),
    "update_shipment_status": (
        "Change a shipment's status, ETA and notes.",
        [
            ("shipment_id", STRING, "Shipment identifier.", True),
            ("status", STRING, "New status.", True),
            ("eta", STRING, "New ETA.", False),
            ("notes", STRING, "Notes.", False),
        ],
    ),
    "get_warehouse_inventory_item": (
        "Read an inventory item.",
        [("inventory_id", STRING, "Inventory identifier.", True)],
    ),
    "list_low_stock_items": (
        "List inventory items below a quantity.",
        [("threshold", INTEGER, "Quantity threshold.", True)],
    ),
    "add_warehouse_inventory": (
        "Add an inventory item.",
        [
            ("sku", STRING, "Stock-keeping unit.", True),
            ("description", STRING, "What the item is.", True),
            ("quantity", INTEGER, "Units.", True),
            ("warehouse_location", STRING, "Bin or aisle.", True),
            ("comments", STRING, "Comments.", False),
        ],
    ),
    "adjust_warehouse_quantity": (
        "Add to (or, negative, remove from) an item's quantity.",
        [("inventory_id", STRING, "Inventory identifier.", True), ("adjustment", INTEGER, "Units to add.", True)],
    ),
    # --- real estate
    "list_clients": ("List the clients.", []),
    "get_client_details": ("Read a client's record.", [("client_id", STRING, "Client identifier.", True)]),
    "add_client_note": (
        "Replace a client's notes.",
        [("client_id", STRING, "Client identifier.", True), ("notes", STRING, "New notes.", True)],
    ),
    "schedule_inspection": (
        "Book an inspection of a property.",
        [
            ("property_id", STRING, "Property identifier.", True),
            ("inspector_name", STRING, "Inspector.", True),
            ("inspection_date", STRING, "Date as YYYY-MM-DD.", True),
        ],
    ),
    "get_inspection_report": ("Read an inspection report.", [("report_id", STRING, "Report identifier.", True)]),
    "submit_inspection_findings": (
        "Record an inspection's findings and recommendations.",
        [
            ("report_id", STRING, "Report identifier.", True),
            ("findings", STRING, "What was found.", True),
            ("recommendations", STRING, "What to do.", True),
        ],
    ),
    "search_properties": (
        "Find listings by keywords, price range or location.",
        [
            ("keywords", STRING, "Text in the address or description.", False),
            ("min_price", NUMBER, "Lowest price.", False),
            ("max_price", NUMBER, "Highest price.", False),
            ("location", STRING, "Part of the address.", False),
        ],
    ),
    "get_property_details": ("Read a listing.", [("property_id", STRING, "Property identifier.", True)]),
    "create_property": (
        "Create a listing.",
        [
            ("address", STRING, "Street address.", True),
            ("price", NUMBER, "Asking price.", True),
            ("bedrooms", INTEGER, "Bedrooms.", True),
            ("bathrooms", INTEGER, "Bathrooms.", True),
            ("description", STRING, "Description.", False),
            ("status", STRING, "Listing status.", False),
            ("listing_date", STRING, "Date as YYYY-MM-DD.", False),
        ],
    ),
    "update_property_description": (
        "Replace a listing's description.",
        [("property_id", STRING, "Property identifier.", True), ("description", STRING, "New description.", True)],
    ),
}


def tool_schema(name: str) -> dict[str, Any]:
    """The ``tools`` entry of one tool."""
    description, params = SPECS[name]
    properties: dict[str, Any] = {}
    for param, kind, text, _ in params:
        prop: dict[str, Any] = {"type": kind, "description": text}
        if kind == STRINGS:
            prop["items"] = {"type": STRING}
        properties[param] = prop
    required = [param for param, _, _, needed in params if needed]
    return {
        "type": "function",
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required},
        "strict": False,
    }


def domain_tools(names: list[str]) -> list[dict[str, Any]]:
    return [tool_schema(name) for name in names]
