"""The emulated address book (通讯录): departments and members of a fictional company.

The JSON file given with ``--directory`` has the same shape as ``Directory.default().to_json()``:
``{"departments": [{"id", "name", "parentid"}], "users": [{"userid", "name", "department", ...}]}``.
A department's heads are its members flagged in ``is_leader_in_dept``, or the department's own
``department_leader`` list when the file gives one (``department/get`` answers them).
Userids are matched case-insensitively and answered in lower case, as WeCom does.
"""

from __future__ import annotations

import json
from pathlib import Path

_DEPARTMENTS = [
    {"id": 1, "name": "星河科技有限公司", "name_en": "Xinghe Technology", "parentid": 0, "order": 100000000},
    {"id": 2, "name": "研发中心", "name_en": "R&D", "parentid": 1, "order": 99999000},
    {"id": 3, "name": "算法组", "name_en": "Algorithms", "parentid": 2, "order": 99998000},
    {"id": 4, "name": "产品部", "name_en": "Product", "parentid": 1, "order": 99997000},
    {"id": 5, "name": "市场部", "name_en": "Marketing", "parentid": 1, "order": 99996000},
    {"id": 6, "name": "人力资源部", "name_en": "HR", "parentid": 1, "order": 99995000},
    {"id": 7, "name": "财务部", "name_en": "Finance", "parentid": 1, "order": 99994000},
]

_USERS = [
    ("zhangwei", "张伟", 2, "研发总监", "1", 1),
    ("lina", "李娜", 3, "算法工程师", "2", 0),
    ("wangfang", "王芳", 3, "高级算法工程师", "2", 1),
    ("liuyang", "刘洋", 2, "后端工程师", "1", 0),
    ("chenjing", "陈静", 4, "产品经理", "2", 1),
    ("yangguang", "杨光", 4, "交互设计师", "1", 0),
    ("zhaolei", "赵磊", 5, "市场经理", "1", 1),
    ("huangmin", "黄敏", 5, "品牌专员", "2", 0),
    ("zhouting", "周婷", 6, "人力资源经理", "2", 1),
    ("wujun", "吴军", 6, "招聘专员", "1", 0),
    ("xuli", "徐丽", 7, "财务经理", "2", 1),
    ("sunhao", "孙浩", 7, "会计", "1", 0),
]


def _default_users() -> list[dict]:
    return [
        {
            "userid": userid, "name": name, "department": [dept], "order": [0],
            "main_department": dept, "position": position, "gender": gender, "status": 1,
            "is_leader_in_dept": [leader], "isleader": leader, "enable": 1,
            "alias": "", "telephone": "", "avatar": "", "thumb_avatar": "",
        }
        for userid, name, dept, position, gender, leader in _USERS
    ]


class Directory:
    def __init__(self, departments: list[dict], users: list[dict]):
        self.departments = [dict(d) for d in departments]
        self._departments_by_id = {int(d["id"]): d for d in self.departments}
        self.users = []
        for user in users:
            user = dict(user, userid=str(user["userid"]).lower())
            user.setdefault("department", [])
            user.setdefault("status", 1)
            self.users.append(user)
        self._users_by_id = {u["userid"]: u for u in self.users}

    @classmethod
    def default(cls) -> Directory:
        return cls(_DEPARTMENTS, _default_users())

    @classmethod
    def load(cls, path: str | Path) -> Directory:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(data.get("departments", []), data.get("users", []))

    def to_json(self) -> dict:
        return {"departments": self.departments, "users": self.users}

    def user(self, userid: str) -> dict | None:
        return self._users_by_id.get(str(userid).strip().lower())

    def update_user(self, userid: str, departments: list[int] | None = None,
                    main_department: int | None = None) -> dict:
        """Move a member to other departments (what an admin does in WeCom's console); the new
        record. ``KeyError`` for a userid not in the directory, ``ValueError`` for a department
        that is not."""
        user = self.user(userid)
        if user is None:
            raise KeyError(userid)
        changed = dict(user)
        if departments is not None:
            if (not isinstance(departments, list) or not departments
                    or any(isinstance(d, bool) or self.department(d) is None for d in departments)):
                raise ValueError("departments must be ids of the directory's departments")
            changed["department"] = [int(d) for d in departments]
            changed["order"] = [0] * len(departments)
            changed["is_leader_in_dept"] = [0] * len(departments)
            main = main_department if main_department is not None else changed["department"][0]
            if int(main) not in changed["department"]:
                raise ValueError("main_department must be one of the departments")
            changed["main_department"] = int(main)
        self.users = [changed if u is user else u for u in self.users]
        self._users_by_id = {**self._users_by_id, changed["userid"]: changed}
        return changed

    def delete_user(self, userid: str) -> dict:
        """Remove a member (they left the company); their last record. ``KeyError`` if unknown."""
        user = self.user(userid)
        if user is None:
            raise KeyError(userid)
        self.users = [u for u in self.users if u is not user]
        self._users_by_id = {k: v for k, v in self._users_by_id.items() if v is not user}
        return user

    def department(self, dept_id) -> dict | None:
        try:
            return self._departments_by_id.get(int(dept_id))
        except (TypeError, ValueError):
            return None

    def subtree(self, dept_id: int) -> list[dict]:
        """A department and every department below it, parents first."""
        root = self.department(dept_id)
        if root is None:
            return []
        found, frontier = [root], [int(root["id"])]
        while frontier:
            parent = frontier.pop(0)
            for d in self.departments:
                if int(d.get("parentid", 0)) == parent and d is not root and d not in found:
                    found.append(d)
                    frontier.append(int(d["id"]))
        return found

    def leaders(self, dept_id) -> list[str]:
        """The department's heads (``department/get``'s ``department_leader``): the list the
        directory file gives the department, else its members marked ``is_leader_in_dept`` for
        it (the flag is per department, in the order of the member's ``department`` list)."""
        department = self.department(dept_id)
        if department is None:
            return []
        if isinstance(department.get("department_leader"), list):
            return [str(u).lower() for u in department["department_leader"]]
        wanted, found = int(department["id"]), []
        for user in self.users:
            flags = user.get("is_leader_in_dept") or []
            for index, dept in enumerate(user.get("department") or []):
                if int(dept) == wanted and index < len(flags) and int(flags[index]) == 1:
                    found.append(user["userid"])
        return found

    def members(self, dept_id: int) -> list[str]:
        """Userids in a department or below it (what ``toparty`` reaches)."""
        ids = {int(d["id"]) for d in self.subtree(dept_id)}
        return [u["userid"] for u in self.users if ids.intersection(int(x) for x in u["department"])]
