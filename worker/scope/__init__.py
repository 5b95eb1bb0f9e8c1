"""Who may see what: the employee's departments and the readers of an answer.

- ``directory``: an employee's departments (WeCom ``user/get``), cached briefly in Redis and in
  the process, forgotten on WeCom's ``change_contact`` events; budgets and the knowledge base
  both read it;
- ``audience``: who reads the answer to a message, the asker of a 1:1 chat or every member of a
  group chat (``appchat/get``), as the ``Audience`` the knowledge base filters by.

Nothing is imported here: a module of the room is imported by its own name.
"""
