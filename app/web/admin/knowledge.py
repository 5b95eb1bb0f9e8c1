"""The knowledge base area (admin only): upload, list, delete, re-index, and a retrieval test box.

Everything goes through ``app.knowledge.store.KnowledgeStore`` (which parses, chunks, seals and
indexes a document, and writes the audit event of each change) and
``app.knowledge.retrieval.Retriever`` (the worker's own search): the page shows what the bot
would find, with the scores, for a question asked as a member of the chosen departments. The
test box posts its question (a question is message content: it stays out of URLs and access logs).
"""

from __future__ import annotations

from flask import abort, flash, redirect, render_template, request, url_for
from flask_login import current_user
from flask_wtf import FlaskForm
from flask_wtf.file import FileField, FileRequired
from wtforms import BooleanField, StringField, TextAreaField
from wtforms.validators import DataRequired, Length, Optional, ValidationError

from app.models import AdminRole
from app.web.admin import bp, roles_required, services
from app.wecom.departments import DepartmentIdError, department_ids


def valid_departments(form, field) -> None:
    """WeCom department ids such as 1,2 (``app.wecom.departments``)."""
    try:
        department_ids(field.data)
    except DepartmentIdError as exc:
        raise ValidationError(f"WeCom department ids such as 1,2: {exc}") from None
MULTIPART_SLACK = 64 * 1024  # the form's other fields and boundaries around the file


class UploadForm(FlaskForm):
    file = FileField("Document 文档 (Markdown, text, HTML, PDF, DOCX)", validators=[FileRequired()])
    title = StringField("Title 标题 (a document with this title is replaced)",
                        validators=[DataRequired(), Length(max=200)])
    departments = StringField("Visible to departments 可见部门 (empty = everyone)",
                              validators=[Optional(), valid_departments])
    contact = StringField("Team to ask 负责团队 (named when the bot cannot answer; e.g. 财务部 分机 8300)",
                          validators=[Optional(), Length(max=200)])


class SearchForm(FlaskForm):
    question = TextAreaField("Question 问题", validators=[DataRequired(), Length(max=500)])
    departments = StringField("As a member of departments 以部门身份 (empty = public documents only)",
                              validators=[Optional(), valid_departments])
    everything = BooleanField("Every document, whatever its visibility 全部文档")


def upload_limit() -> None:
    """Let the upload route's body be as large as a document may be (the app's limit is a
    callback's); runs before the CSRF check, which reads the form."""
    if request.endpoint == "admin.knowledge_upload":
        request.max_content_length = services().settings.kb_max_upload_bytes + MULTIPART_SLACK


def _actor() -> str:
    return f"admin:{current_user.name}"


def _store():
    from app.knowledge.store import KnowledgeStore

    return KnowledgeStore(services())


def _page(upload: UploadForm | None = None, search: SearchForm | None = None, result=None, status: int = 200):
    from app.knowledge.retrieval import relevance_rule

    return render_template("admin/knowledge.html", documents=_store().list(), upload=upload or UploadForm(),
                           search=search or SearchForm(), result=result,
                           rule=relevance_rule(services().settings, result) if result is not None else "",
                           max_mb=services().settings.kb_max_upload_bytes / 2**20), status


@bp.get("/knowledge")
@roles_required(AdminRole.ADMIN)
def knowledge():
    return _page()


@bp.post("/knowledge/upload")
@roles_required(AdminRole.ADMIN)
def knowledge_upload():
    from app.knowledge.parsing import UploadError
    from app.knowledge.store import parse_departments

    form = UploadForm()
    if not form.validate_on_submit():
        return _page(upload=form, status=400)
    upload = form.file.data
    data = upload.read()
    try:
        result = _store().add(data, form.title.data, filename=upload.filename or None,
                              departments=parse_departments(form.departments.data), actor=_actor(),
                              contact=form.contact.data)
    except UploadError as exc:
        form.form_errors.append(f"{upload.filename or 'the file'}: {exc}")
        return _page(upload=form, status=400)
    flash(f"Document {result.document_id} {result.status}: {result.chunks} chunks ({result.doc_type}). "
          "文档已保存。")
    return redirect(url_for("admin.knowledge"))


@bp.post("/knowledge/<int:document_id>/delete")
@roles_required(AdminRole.ADMIN)
def knowledge_delete(document_id: int):
    if not FlaskForm().validate_on_submit():
        abort(400)
    if not _store().remove(document_id, actor=_actor()):
        abort(404)
    flash(f"Document {document_id} deleted. 文档已删除。")
    return redirect(url_for("admin.knowledge"))


@bp.post("/knowledge/reindex")
@roles_required(AdminRole.ADMIN)
def knowledge_reindex():
    if not FlaskForm().validate_on_submit():
        abort(400)
    count = _store().reindex(actor=_actor())
    flash(f"{count} documents re-indexed. 已重建索引。")
    return redirect(url_for("admin.knowledge"))


@bp.post("/knowledge/search")
@roles_required(AdminRole.ADMIN)
def knowledge_search():
    from app.knowledge.retrieval import EVERYTHING, Retriever
    from app.knowledge.store import parse_departments

    form = SearchForm()
    if not form.validate_on_submit():
        return _page(search=form, status=400)
    departments = EVERYTHING if form.everything.data else parse_departments(form.departments.data)
    result = Retriever(services()).search(form.question.data, departments, top_k=10)
    return _page(search=form, result=result)
