"""WeCom sign-in for the admin site (企业微信扫码登录 and in-client OAuth).

The browser is sent to WeCom (``authorize_url``), comes back with a ``code`` and our ``state``,
and ``auth/getuserinfo`` tells whose code it is. ``login_state`` makes a started sign-in
single-use, short-lived and bound to the browser that started it; ``roles`` maps WeCom userids
and departments to admin roles; ``signin`` puts the two together and links the WeCom member to
an admin account. The web pages are in ``app/web/admin/wecom_login.py``; docs/wecom-signin.md.
"""
