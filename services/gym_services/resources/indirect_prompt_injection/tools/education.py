"""Education: courses, financial aid, grades, student records (plus messaging).

Environment: ``courses``, ``financial_aid``, ``grades``, ``students`` (dicts keyed by ID, each may be
absent), ``messages``, ``current_user``. New courses get ``C-`` and six hex digits, grades ``G-``.
"""

from __future__ import annotations

from typing import Any

from gym_services.resources.indirect_prompt_injection.state import new_id
from gym_services.resources.indirect_prompt_injection.tools.common import Handler, appended_text, lookup, same_text


def list_courses(env, department=None, **kwargs) -> list[Any]:
    return [
        c for c in env.get("courses", {}).values() if not (department and not same_text(c, "department", department))
    ]


def get_course_detail(env, course_id) -> Any:
    return lookup(env.get("courses", {}), course_id, {"error": f"Course {course_id} not found."})


def create_course(env, course_code, title, description, credits, department, instructor_id, schedule, **kwargs) -> str:
    course_id = new_id("C-")
    env.setdefault("courses", {})[course_id] = {
        "course_id": course_id,
        "course_code": course_code,
        "title": title,
        "description": description,
        "credits": credits,
        "department": department,
        "instructor_id": instructor_id,
        "schedule": schedule,
    }
    return f"Course '{title}' ({course_code}) created with ID {course_id}."


def get_financial_aid(env, student_id) -> list[Any]:
    return [aid for aid in env.get("financial_aid", {}).values() if aid.get("student_id") == student_id]


def adjust_financial_aid(env, aid_id, amount=None, status=None, reviewer_notes=None, **kwargs) -> Any:
    """Change an award's amount, status or reviewer notes; answers with the award as it now is."""
    awards = env.get("financial_aid", {})
    if aid_id not in awards:
        return {"error": f"Financial aid record {aid_id} not found."}
    award = awards[aid_id]
    for field, value in (("amount", amount), ("status", status), ("reviewer_notes", reviewer_notes)):
        if value is not None:
            award[field] = value
    return award


def get_grades_for_student(env, student_id) -> list[Any]:
    return [grade for grade in env.get("grades", {}).values() if grade.get("student_id") == student_id]


def submit_grade(env, student_id, course_id, assignment_name, score, max_score, grader_comments="", **kwargs) -> str:
    grade_id = new_id("G-")
    env.setdefault("grades", {})[grade_id] = {
        "grade_id": grade_id,
        "student_id": student_id,
        "course_id": course_id,
        "assignment_name": assignment_name,
        "score": score,
        "max_score": max_score,
        "grader_comments": grader_comments,
    }
    return f"Grade submitted for student {student_id} in course {course_id}."


def _student_matches(student, name, major, email) -> bool:
    if name:
        full_name = f"{student.get('first_name', '')} {student.get('last_name', '')}".lower()
        if name.lower() not in full_name:
            return False
    if major and major.lower() not in student.get("major", "").lower():
        return False
    return not email or email.lower() == student.get("email", "").lower()


def search_students(env, name=None, major=None, email=None, **kwargs) -> list[Any]:
    """Students whose full name contains ``name``, whose major contains ``major``, with this email."""
    return [s for s in env.get("students", {}).values() if _student_matches(s, name, major, email)]


def get_student_record(env, student_id) -> Any:
    return lookup(env.get("students", {}), student_id, {"error": f"Student {student_id} not found."})


def update_student_advisor_notes(env, student_id, notes) -> str:
    students = env.get("students", {})
    if student_id not in students:
        return f"Error: Student {student_id} not found."
    student = students[student_id]
    student["advisor_notes"] = appended_text(student.get("advisor_notes", ""), notes)
    return f"Advisor notes updated for student {student_id}."


#: shared tools (tools/common.py) this domain offers too
SHARED = ("get_messages", "send_message")

TOOLS: dict[str, Handler] = {
    "list_courses": list_courses,
    "get_course_detail": get_course_detail,
    "create_course": create_course,
    "get_financial_aid": get_financial_aid,
    "adjust_financial_aid": adjust_financial_aid,
    "get_grades_for_student": get_grades_for_student,
    "submit_grade": submit_grade,
    "search_students": search_students,
    "get_student_record": get_student_record,
    "update_student_advisor_notes": update_student_advisor_notes,
}
