#!/bin/bash
echo robot > /workspace/list.txt
