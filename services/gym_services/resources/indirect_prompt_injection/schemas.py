"""Function-tool definitions (Responses API ``tools`` entries) for every tool of every domain.

A task offers the model its domain's tools (``responses_create_params.tools``); NeMo Gym's example
tasks carry their own definitions for healthcare and HR. These cover all nine domains, so tasks for
the other seven can be written (``data/domain_examples.jsonl`` uses them). Parameters that a tool
requires are listed as required; the server itself accepts whatever a model sends (see ``tools/``).
"""

from __future__ import annotations

from typing import Any

S, I, N, B = "string", "integer", "number", "boolean"
STRINGS = "array"

#: tool -> (description, [(parameter, type, description, required)])
SPECS: dict[str, tuple[str, list[tuple[str, str, str, bool]]]] = {
    # --- healthcare
    "search_patients": (
        "Find patients whose name or a listed condition contains the text.",
        [("query", S, "Text to look for in patient names and conditions.", True)],
    ),
    "get_patient_record": (
        "Read one patient's full record (conditions, medications, chart notes).",
        [("patient_id", S, "Patient identifier, for example P-1234.", True)],
    ),
    "update_patient_chart": (
        "Add clinical notes to a patient's chart.",
        [("patient_id", S, "Patient identifier.", True), ("notes", S, "Notes to add on a new line.", True)],
    ),
    "get_schedule": ("List the appointments on a date.", [("date", S, "Date as YYYY-MM-DD.", True)]),
    "schedule_appointment": (
        "Book an appointment for a patient.",
        [
            ("patient_id", S, "Patient identifier.", True),
            ("date", S, "Date as YYYY-MM-DD.", True),
            ("time", S, "Time as HH:MM.", True),
            ("reason", S, "Why the patient is seen.", True),
        ],
    ),
    "cancel_appointment": ("Cancel an appointment.", [("appointment_id", S, "Appointment identifier.", True)]),
    "send_referral": (
        "Refer a patient to a specialist by email.",
        [
            ("patient_id", S, "Patient to refer.", True),
            ("specialist_email", S, "Specialist's email address.", True),
            ("reason", S, "Reason for the referral.", True),
        ],
    ),
    "prescribe_medication": (
        "Prescribe a medication to a patient.",
        [
            ("patient_id", S, "Patient identifier.", True),
            ("medication", S, "Medication name.", True),
            ("dosage", S, "Dose and frequency.", True),
            ("instructions", S, "Instructions for the patient.", True),
        ],
    ),
    "get_prescriptions": ("List a patient's prescriptions.", [("patient_id", S, "Patient identifier.", True)]),
    "get_lab_results": ("List a patient's lab results.", [("patient_id", S, "Patient identifier.", True)]),
    # --- messaging, shared by several domains
    "send_message": (
        "Send a message.",
        [
            ("to", S, "Recipient address.", True),
            ("subject", S, "Subject line.", True),
            ("body", S, "Message text.", True),
        ],
    ),
    "get_messages": ("Read the current user's messages.", []),
    # --- hr
    "search_candidates": (
        "Find candidates whose name, resume, notes or position contain the text.",
        [("query", S, "Text to look for.", True), ("status", S, "Only candidates in this status.", False)],
    ),
    "get_candidate_profile": ("Read a candidate's full profile.", [("candidate_id", S, "Candidate identifier.", True)]),
    "update_candidate_status": (
        "Change a candidate's application status.",
        [("candidate_id", S, "Candidate identifier.", True), ("status", S, "New status.", True)],
    ),
    "schedule_interview": (
        "Book an interview with a candidate.",
        [
            ("candidate_id", S, "Candidate identifier.", True),
            ("interviewer_email", S, "Interviewer's email.", True),
            ("date", S, "Date as YYYY-MM-DD.", True),
            ("time", S, "Time as HH:MM.", True),
        ],
    ),
    "get_interview_schedule": ("List interviews, optionally on one date.", [("date", S, "Date as YYYY-MM-DD.", False)]),
    "submit_interview_feedback": (
        "Record interview feedback and a rating for a candidate.",
        [
            ("candidate_id", S, "Candidate identifier.", True),
            ("feedback", S, "Written feedback.", True),
            ("rating", I, "Rating from 1 to 5.", True),
        ],
    ),
    "send_offer": (
        "Send a job offer to a candidate.",
        [
            ("candidate_id", S, "Candidate identifier.", True),
            ("position", S, "Position offered.", True),
            ("salary", S, "Annual salary.", True),
            ("start_date", S, "Start date as YYYY-MM-DD.", True),
        ],
    ),
    "send_email": (
        "Send an email.",
        [
            ("recipient", S, "Recipient address.", True),
            ("subject", S, "Subject line.", True),
            ("body", S, "Email text.", True),
        ],
    ),
    "get_inbox": ("Read the inbox.", []),
    "get_open_positions": ("List the open positions.", []),
    "create_job_posting": (
        "Publish a new job posting.",
        [
            ("title", S, "Job title.", True),
            ("description", S, "What the job is.", True),
            ("requirements", S, "What candidates need.", True),
        ],
    ),
    # --- ecommerce
    "search_orders": (
        "List orders, optionally of one customer or in one status.",
        [("customer_id", S, "Customer identifier.", False), ("status", S, "Order status.", False)],
    ),
    "get_order_details": ("Read an order.", [("order_id", S, "Order identifier.", True)]),
    "update_order_status": (
        "Change an order's status.",
        [("order_id", S, "Order identifier.", True), ("status", S, "New status.", True)],
    ),
    "add_order_note": (
        "Add an internal note to an order.",
        [("order_id", S, "Order identifier.", True), ("note", S, "Note text.", True)],
    ),
    "search_products": (
        "Find products by text in name or description, or by category.",
        [("query", S, "Text to look for.", False), ("category", S, "Product category.", False)],
    ),
    "get_product_details": ("Read a product.", [("product_id", S, "Product identifier.", True)]),
    "update_product_stock": (
        "Set a product's stock quantity.",
        [("product_id", S, "Product identifier.", True), ("stock_quantity", I, "Units in stock.", True)],
    ),
    "process_refund": (
        "Process a refund.",
        [
            ("refund_id", S, "Refund identifier.", True),
            ("amount", N, "Amount refunded.", True),
            ("reason", S, "Reason for the refund.", False),
            ("admin_notes", S, "Internal notes.", False),
        ],
    ),
    "create_support_ticket": (
        "Open a support ticket for a customer.",
        [
            ("customer_id", S, "Customer identifier.", True),
            ("subject", S, "Short summary.", True),
            ("description", S, "What happened.", True),
            ("order_id", S, "Related order.", False),
            ("priority", S, "low, medium or high.", False),
        ],
    ),
    "get_ticket_details": ("Read a support ticket.", [("ticket_id", S, "Ticket identifier.", True)]),
    "update_ticket_status": (
        "Change a support ticket's status and priority.",
        [
            ("ticket_id", S, "Ticket identifier.", True),
            ("status", S, "New status.", True),
            ("priority", S, "New priority.", False),
        ],
    ),
    # --- education
    "list_courses": ("List courses, optionally of one department.", [("department", S, "Department name.", False)]),
    "get_course_detail": ("Read a course.", [("course_id", S, "Course identifier.", True)]),
    "create_course": (
        "Create a course offering.",
        [
            ("course_code", S, "Catalogue code.", True),
            ("title", S, "Course title.", True),
            ("description", S, "What the course covers.", True),
            ("credits", I, "Credit hours.", True),
            ("department", S, "Department.", True),
            ("instructor_id", S, "Instructor identifier.", True),
            ("schedule", S, "Meeting times.", True),
        ],
    ),
    "get_financial_aid": ("List a student's financial aid awards.", [("student_id", S, "Student identifier.", True)]),
    "adjust_financial_aid": (
        "Change a financial aid award.",
        [
            ("aid_id", S, "Award identifier.", True),
            ("amount", N, "New amount.", False),
            ("status", S, "New status.", False),
            ("reviewer_notes", S, "Reviewer's notes.", False),
        ],
    ),
    "get_grades_for_student": ("List a student's grades.", [("student_id", S, "Student identifier.", True)]),
    "submit_grade": (
        "Record a grade.",
        [
            ("student_id", S, "Student identifier.", True),
            ("course_id", S, "Course identifier.", True),
            ("assignment_name", S, "Assignment.", True),
            ("score", N, "Points scored.", True),
            ("max_score", N, "Points possible.", True),
            ("grader_comments", S, "Comments.", False),
        ],
    ),
    "search_students": (
        "Find students by name, major or email.",
        [
            ("name", S, "Part of the student's name.", False),
            ("major", S, "Part of the major.", False),
            ("email", S, "Exact email address.", False),
        ],
    ),
    "get_student_record": ("Read a student's record.", [("student_id", S, "Student identifier.", True)]),
    "update_student_advisor_notes": (
        "Add advisor notes to a student's record.",
        [("student_id", S, "Student identifier.", True), ("notes", S, "Notes to add on a new line.", True)],
    ),
    # --- insurance
    "add_adjuster_note": (
        "Add an adjuster's field note to a claim.",
        [
            ("claim_id", S, "Claim identifier.", True),
            ("adjuster_id", S, "Adjuster identifier.", True),
            ("note_text", S, "Note text.", True),
        ],
    ),
    "get_adjuster_notes_for_claim": (
        "List the adjuster notes of a claim.",
        [("claim_id", S, "Claim identifier.", True)],
    ),
    "create_claim": (
        "Open a claim on a policy.",
        [
            ("policy_id", S, "Policy identifier.", True),
            ("claim_number", S, "Claim number.", True),
            ("date_of_loss", S, "Date of loss as YYYY-MM-DD.", True),
            ("description", S, "What happened.", True),
            ("claim_type", S, "Kind of claim.", True),
            ("amount_requested", N, "Amount claimed.", True),
            ("adjuster_id", S, "Assigned adjuster.", True),
        ],
    ),
    "get_claim_by_id": ("Read a claim.", [("claim_id", S, "Claim identifier.", True)]),
    "update_claim_description": (
        "Replace a claim's description.",
        [("claim_id", S, "Claim identifier.", True), ("description", S, "New description.", True)],
    ),
    "get_messages_for_claim": ("List the messages about a claim.", [("claim_id", S, "Claim identifier.", True)]),
    "flag_fraud_investigation": (
        "Flag a claim for fraud investigation.",
        [
            ("claim_id", S, "Claim identifier.", True),
            ("investigator_id", S, "Investigator identifier.", True),
            ("flag_reason", S, "Why the claim is suspicious.", True),
            ("severity", S, "low, medium or high.", True),
        ],
    ),
    "process_payout": (
        "Record a payout on a claim.",
        [
            ("claim_id", S, "Claim identifier.", True),
            ("amount", N, "Amount paid.", True),
            ("date", S, "Payment date as YYYY-MM-DD.", True),
            ("method", S, "Payment method.", True),
            ("notes", S, "Notes.", True),
        ],
    ),
    "get_policy_by_id": ("Read a policy.", [("policy_id", S, "Policy identifier.", True)]),
    "search_policies_by_holder": (
        "Find policies by policyholder name.",
        [("policyholder_name", S, "Part of the policyholder's name.", True)],
    ),
    "update_policy_notes": (
        "Replace a policy's notes.",
        [("policy_id", S, "Policy identifier.", True), ("notes", S, "New notes.", True)],
    ),
    # --- it helpdesk
    "search_assets": (
        "Find assets by tag, type, status or location.",
        [
            ("tag", S, "Part of the asset tag.", False),
            ("type", S, "Asset type.", False),
            ("status", S, "Asset status.", False),
            ("location", S, "Part of the location.", False),
        ],
    ),
    "get_asset": ("Read an asset.", [("asset_id", S, "Asset identifier.", True)]),
    "update_asset_notes": (
        "Replace an asset's notes.",
        [("asset_id", S, "Asset identifier.", True), ("notes", S, "New notes.", True)],
    ),
    "search_kb_articles": (
        "Find knowledge-base articles by keyword or category.",
        [("keyword", S, "Text in the title or content.", False), ("category", S, "Article category.", False)],
    ),
    "get_kb_article": ("Read a knowledge-base article.", [("article_id", S, "Article identifier.", True)]),
    "update_kb_article_content": (
        "Replace a knowledge-base article's content.",
        [("article_id", S, "Article identifier.", True), ("content", S, "New content.", True)],
    ),
    "search_incidents": (
        "Find incidents by keyword, status or priority.",
        [
            ("keyword", S, "Text in the title or description.", False),
            ("status", S, "Incident status.", False),
            ("priority", S, "Incident priority.", False),
        ],
    ),
    "get_incident": ("Read an incident.", [("ticket_id", S, "Incident identifier.", True)]),
    "update_incident_description": (
        "Replace an incident's description.",
        [("ticket_id", S, "Incident identifier.", True), ("description", S, "New description.", True)],
    ),
    "create_incident": (
        "Open an incident.",
        [
            ("title", S, "Short title.", True),
            ("description", S, "What is wrong.", True),
            ("priority", S, "Low, Medium or High.", True),
            ("assigned_to", S, "Team or person.", True),
        ],
    ),
    # --- legal
    "add_billing_entry": (
        "Record billable time on a case.",
        [
            ("case_id", S, "Case identifier.", True),
            ("date", S, "Date as YYYY-MM-DD.", True),
            ("description", S, "Work done.", True),
            ("hours", N, "Hours worked.", True),
            ("rate", N, "Hourly rate.", True),
            ("billable", B, "Whether the client is billed.", False),
            ("attorney", S, "Attorney.", False),
        ],
    ),
    "get_billing_report": (
        "List billing entries of a case or a date range.",
        [
            ("case_id", S, "Case identifier.", False),
            ("start_date", S, "First date.", False),
            ("end_date", S, "Last date.", False),
            ("billable", B, "Only billable (or non-billable) entries.", False),
        ],
    ),
    "search_cases": (
        "Find cases by client, type or status.",
        [
            ("client_name", S, "Part of the client's name.", False),
            ("case_type", S, "Case type.", False),
            ("status", S, "Case status.", False),
        ],
    ),
    "get_case_file": ("Read a case file.", [("case_id", S, "Case identifier.", True)]),
    "update_case_notes": (
        "Replace a case's internal notes.",
        [("case_id", S, "Case identifier.", True), ("notes", S, "New notes.", True)],
    ),
    "get_court_schedule": ("Read a court date.", [("schedule_id", S, "Schedule identifier.", True)]),
    "search_schedules": (
        "Find court dates by case, date range or hearing type.",
        [
            ("case_id", S, "Case identifier.", False),
            ("start_date", S, "First date.", False),
            ("end_date", S, "Last date.", False),
            ("hearing_type", S, "Hearing type.", False),
        ],
    ),
    "update_schedule_location": (
        "Change a court date's location or notes.",
        [
            ("schedule_id", S, "Schedule identifier.", True),
            ("location", S, "New location.", False),
            ("notes", S, "New notes.", False),
        ],
    ),
    "create_document_filing": (
        "Record a court filing.",
        [
            ("case_id", S, "Case identifier.", True),
            ("document_type", S, "Kind of document.", True),
            ("title", S, "Document title.", True),
            ("filing_date", S, "Date as YYYY-MM-DD.", True),
            ("court_name", S, "Court.", True),
            ("file_path", S, "Where the document is stored.", True),
            ("served_parties", STRINGS, "Parties served.", False),
            ("notes", S, "Notes.", False),
        ],
    ),
    "get_document_filing": ("Read a court filing.", [("filing_id", S, "Filing identifier.", True)]),
    # --- logistics
    "get_carrier_messages": (
        "Read carrier messages, optionally about one shipment.",
        [("shipment_id", S, "Shipment identifier.", False)],
    ),
    "send_carrier_message": (
        "Send a message to a carrier.",
        [
            ("to", S, "Carrier address.", True),
            ("subject", S, "Subject line.", True),
            ("body", S, "Message text.", True),
        ],
    ),
    "get_customs_declaration_by_shipment": (
        "Read the customs declaration of a shipment.",
        [("shipment_id", S, "Shipment identifier.", True)],
    ),
    "submit_customs_declaration": (
        "File or update a shipment's customs declaration.",
        [
            ("shipment_id", S, "Shipment identifier.", True),
            ("hs_code", S, "Harmonized System code.", True),
            ("declared_value", N, "Declared value.", True),
            ("additional_info", S, "Further details.", False),
        ],
    ),
    "get_delivery_schedule": (
        "Read a shipment's delivery schedule.",
        [("shipment_id", S, "Shipment identifier.", True)],
    ),
    "get_shipment_by_id": ("Read a shipment.", [("shipment_id", S, "Shipment identifier.", True)]),
    "search_shipments_by_status": ("List shipments in a status.", [("status", S, "Shipment status.", True)]),
    "update_shipment_status": (
        "Change a shipment's status, ETA and notes.",
        [
            ("shipment_id", S, "Shipment identifier.", True),
            ("status", S, "New status.", True),
            ("eta", S, "New ETA.", False),
            ("notes", S, "Notes.", False),
        ],
    ),
    "get_warehouse_inventory_item": ("Read an inventory item.", [("inventory_id", S, "Inventory identifier.", True)]),
    "list_low_stock_items": ("List inventory items below a quantity.", [("threshold", I, "Quantity threshold.", True)]),
    "add_warehouse_inventory": (
        "Add an inventory item.",
        [
            ("sku", S, "Stock-keeping unit.", True),
            ("description", S, "What the item is.", True),
            ("quantity", I, "Units.", True),
            ("warehouse_location", S, "Bin or aisle.", True),
            ("comments", S, "Comments.", False),
        ],
    ),
    "adjust_warehouse_quantity": (
        "Add to (or, negative, remove from) an item's quantity.",
        [("inventory_id", S, "Inventory identifier.", True), ("adjustment", I, "Units to add.", True)],
    ),
    # --- real estate
    "list_clients": ("List the clients.", []),
    "get_client_details": ("Read a client's record.", [("client_id", S, "Client identifier.", True)]),
    "add_client_note": (
        "Replace a client's notes.",
        [("client_id", S, "Client identifier.", True), ("notes", S, "New notes.", True)],
    ),
    "schedule_inspection": (
        "Book an inspection of a property.",
        [
            ("property_id", S, "Property identifier.", True),
            ("inspector_name", S, "Inspector.", True),
            ("inspection_date", S, "Date as YYYY-MM-DD.", True),
        ],
    ),
    "get_inspection_report": ("Read an inspection report.", [("report_id", S, "Report identifier.", True)]),
    "submit_inspection_findings": (
        "Record an inspection's findings and recommendations.",
        [
            ("report_id", S, "Report identifier.", True),
            ("findings", S, "What was found.", True),
            ("recommendations", S, "What to do.", True),
        ],
    ),
    "search_properties": (
        "Find listings by keywords, price range or location.",
        [
            ("keywords", S, "Text in the address or description.", False),
            ("min_price", N, "Lowest price.", False),
            ("max_price", N, "Highest price.", False),
            ("location", S, "Part of the address.", False),
        ],
    ),
    "get_property_details": ("Read a listing.", [("property_id", S, "Property identifier.", True)]),
    "create_property": (
        "Create a listing.",
        [
            ("address", S, "Street address.", True),
            ("price", N, "Asking price.", True),
            ("bedrooms", I, "Bedrooms.", True),
            ("bathrooms", I, "Bathrooms.", True),
            ("description", S, "Description.", False),
            ("status", S, "Listing status.", False),
            ("listing_date", S, "Date as YYYY-MM-DD.", False),
        ],
    ),
    "update_property_description": (
        "Replace a listing's description.",
        [("property_id", S, "Property identifier.", True), ("description", S, "New description.", True)],
    ),
}


def tool_schema(name: str) -> dict[str, Any]:
    """The ``tools`` entry of one tool."""
    description, params = SPECS[name]
    properties: dict[str, Any] = {}
    for param, kind, text, _ in params:
        prop: dict[str, Any] = {"type": kind, "description": text}
        if kind == STRINGS:
            prop["items"] = {"type": S}
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
